// Tools > Calibrate This Machine and Use This Machine's Profile under QT_QPA_PLATFORM=offscreen: CalibrateJob
// on stand-in engines (stderr split mid-line across reads, a failure with the engine's reason), then the real
// main window running the real `meshstudio-engine calibrate --quick` into a temporary profiles folder with
// its progress dialog, the profile applied to the project as one undoable edit that plans, and the failures
// (no engine, a profiles folder that cannot be made, the engine refusing its output file, a bad profile
// file, a cancel), each shown without a modal dialog and leaving no profile behind.
#include <QtTest>

#include <QAction>
#include <QApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QProgressDialog>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTemporaryDir>
#include <cmath>

#include <nlohmann/json.hpp>

#include "plan/device_profile.h"
#include "plan/run_config.h"
#include "ui/models/project_document.h"
#include "ui/run/calibrate_job.h"
#include "ui/run/engine_client.h"
#include "ui/views/main_window.h"
#include "ui_test_util.h"

namespace {

using ms::test::waitForSnapshot;

constexpr int kCalibrateTimeoutMs = 60000;  // --quick takes ~3 s here, ~10 s with a compiler beside it

// A GPT small enough to plan in a moment: 2 pipeline stages x 2 replicas on two nodes of 2 cpu devices, so
// both the link inside a node and the one between nodes carry traffic.
ms::RunConfig twoNodes() {
  ms::RunConfig c;
  c.name = "calibrate-tiny";
  c.device = ms::DeviceChoice::Cpu;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.vocab = 256;
  c.model.context = 32;
  c.data.kind = ms::DataKind::Text;
  c.data.files = {"/usr/share/games/fortunes/*.u8"};
  c.mesh.nodes = {ms::NodeConfig{"n0", "cpu", 2}, ms::NodeConfig{"n1", "cpu", 2}};
  c.parallel.dp = 2;
  c.parallel.pp = 2;
  c.parallel.microbatches = 2;
  c.training.steps = 2;
  c.training.batchSize = 4;
  c.training.seqLen = 32;
  c.training.threads = 1;
  return c;
}

// A stand-in engine: a shell script at dir/name running body (its arguments: calibrate --out FILE ...).
QString writeScript(const QString& dir, const QString& name, const QByteArray& body) {
  const QString path = dir + "/" + name;
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return QString();
  f.write("#!/bin/sh\n" + body);
  f.close();
  f.setPermissions(QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
  return path;
}

QAction* action(ms::MainWindow& w, const char* name) {
  return w.findChild<QAction*>(QString::fromLatin1(name));
}

}  // namespace

class TestUiCalibrate : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("MeshStudioTests");
    QCoreApplication::setApplicationName("tst_ui_calibrate");
  }

  // Progress lines split mid-line across reads arrive whole, in order; the summary without a newline too.
  void jobReadsSplitLines() {
    QTemporaryDir dir;
    const QString engine =
        writeScript(dir.path(), "engine.sh",
                    "out=$3\n"
                    "printf 'calibrate: [1/3] gemm fp32' >&2; sleep 0.2\n"
                    "printf ' 8x32x32: 1e10 FLOP/s\\ncalibrate: [2/3] add: 2e9 B/s\\ncalib' >&2\n"
                    "sleep 0.2\n"
                    "printf 'rate: [3/3] adamw: 1e9 params/s\\n' >&2\n"
                    "echo '{}' > \"$out\"\n"
                    "printf 'calibrate: 3 measurements in 0.4 s; profile written to %s' "
                    "\"$out\" >&2\n");
    QVERIFY(!engine.isEmpty());
    ms::CalibrateJob job;
    job.setEnginePath(engine);
    job.setExtraArguments({"--quick"});
    QSignalSpy progress(&job, &ms::CalibrateJob::progress);
    QSignalSpy finished(&job, &ms::CalibrateJob::finished);
    const QString out = dir.path() + "/p.json";
    QVERIFY(job.start(out));
    QVERIFY(!job.start(out));  // one at a time
    QCOMPARE(job.commandLine(), (QStringList{engine, "calibrate", "--out", out, "--quick"}));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 10000);
    QVERIFY2(finished.at(0).at(0).toBool(), qPrintable(finished.at(0).at(1).toString()));
    QCOMPARE(finished.at(0).at(1).toString(), out);
    QCOMPARE(int(progress.count()), 3);
    const QStringList whats = {"gemm fp32 8x32x32: 1e10 FLOP/s", "add: 2e9 B/s", "adamw: 1e9 params/s"};
    for (int i = 0; i < 3; ++i) {
      QCOMPARE(progress.at(i).at(0).toInt(), i + 1);
      QCOMPARE(progress.at(i).at(1).toInt(), 3);
      QCOMPARE(progress.at(i).at(2).toString(), whats[i]);
    }
    QVERIFY2(job.summary().startsWith("calibrate: 3 measurements in 0.4 s"), qPrintable(job.summary()));
    QVERIFY(!job.isRunning());
  }

  // A failing engine: its own reason leads the message, and the FILE.tmp it left is removed.
  void jobReportsTheEnginesReason() {
    QTemporaryDir dir;
    const QString engine = writeScript(
        dir.path(), "engine.sh",
        "echo partial > \"$3.tmp\"\n"
        "echo 'calibrate: [1/2] link shm sendrecv 8 B: 6e-7 s' >&2\n"
        "echo 'mpirun noticed that process rank 1 exited' >&2\n"
        "echo 'meshstudio-engine calibrate: link shm: mpirun exited with code 1 (its messages are "
        "above)' >&2\n"
        "exit 1\n");
    ms::CalibrateJob job;
    job.setEnginePath(engine);
    QSignalSpy finished(&job, &ms::CalibrateJob::finished);
    const QString out = dir.path() + "/p.json";
    QVERIFY(job.start(out));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 10000);
    QVERIFY(!finished.at(0).at(0).toBool());
    const QString message = finished.at(0).at(1).toString();
    QVERIFY2(message.startsWith("link shm: mpirun exited with code 1"), qPrintable(message));
    QVERIFY2(message.contains("mpirun noticed that process rank 1 exited"), qPrintable(message));
    QVERIFY2(message.contains("the engine exited with code 1"), qPrintable(message));
    QCOMPARE(job.done(), 1);
    QCOMPARE(job.total(), 2);
    QVERIFY(!QFileInfo::exists(out));
    QVERIFY(!QFileInfo::exists(out + ".tmp"));
  }

  // The real engine from the real window: progress to the announced total, the profile written and readable,
  // then applied to the project as one edit that plans and that undo takes back.
  void calibratesAndUsesTheProfile() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    w.setProfilesFolder(dir.path() + "/profiles");
    w.setCalibrateArguments({"--quick"});
    w.engineClient()->setEnginePath(MS_ENGINE_EXE);
    w.document()->reset(twoNodes());
    QVERIFY(waitForSnapshot(w));
    QVERIFY2(w.snapshot()->ok(), qPrintable(w.snapshot()->error));
    const ms::RunConfig before = w.document()->config();

    const QString path = w.thisMachineProfilePath();
    QVERIFY2(path.startsWith(dir.path() + "/profiles/") && path.endsWith(".json"), qPrintable(path));
    QVERIFY(QFileInfo(path).fileName().contains(QRegularExpression("^[A-Za-z0-9._-]+\\.json$")));
    QAction* calibrate = action(w, "calibrateMachineAction");
    QAction* use = action(w, "useMachineProfileAction");
    QVERIFY(calibrate && use);
    QVERIFY(calibrate->isEnabled());
    QVERIFY(!use->isEnabled());  // no profile yet

    QSignalSpy progress(w.calibrateJob(), &ms::CalibrateJob::progress);
    QSignalSpy finished(w.calibrateJob(), &ms::CalibrateJob::finished);
    calibrate->trigger();  // returns at once: the dialog is shown, not exec()'d
    QVERIFY(w.calibrateJob()->isRunning());
    QProgressDialog* dialog = w.calibrateDialog();
    QVERIFY(dialog);
    QVERIFY(dialog->isVisible());
    QCOMPARE(dialog->windowModality(), Qt::WindowModal);
    QVERIFY(!calibrate->isEnabled());
    QVERIFY(w.calibrateJob()->commandLine().contains("--quick"));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, kCalibrateTimeoutMs);
    QVERIFY2(finished.at(0).at(0).toBool(), qPrintable(finished.at(0).at(1).toString()));
    QCOMPARE(finished.at(0).at(1).toString(), path);

    QVERIFY(QFileInfo(path).isFile());
    QVERIFY(!QFileInfo::exists(path + ".tmp"));
    auto profile = ms::loadDeviceProfile(path.toStdString());
    QVERIFY2(profile, profile ? "" : profile.message().c_str());
    QVERIFY((*profile)->link("shm") && (*profile)->link("tcp"));

    // Progress: every measurement once, in order, up to the total the engine announced.
    const int total = w.calibrateJob()->total();
    QVERIFY(total > 0);
    QVERIFY2(progress.count() >= total, qPrintable(QString("%1 < %2").arg(progress.count()).arg(total)));
    int previous = 0;
    for (const QList<QVariant>& args : progress) {
      QCOMPARE(args.at(1).toInt(), total);
      QCOMPARE(args.at(0).toInt(), previous + 1);  // each measurement once, in the engine's order
      QVERIFY(!args.at(2).toString().isEmpty());
      previous = args.at(0).toInt();
    }
    QCOMPARE(previous, total);
    QCOMPARE(dialog, w.calibrateDialog());
    QCOMPARE(dialog->maximum(), total);
    QCOMPARE(dialog->value(), total);
    QVERIFY2(dialog->labelText().contains(QString("Measurement %1 of %1").arg(total)),
             qPrintable(dialog->labelText()));
    QVERIFY(!dialog->isVisible());
    QVERIFY(calibrate->isEnabled());
    const QString said = w.statusBar()->currentMessage();
    QVERIFY2(said.contains(path) && said.contains("Use This Machine's Profile"), qPrintable(said));
    QVERIFY(w.lastError().isEmpty());

    // Use it: one undoable edit.
    QVERIFY(use->isEnabled());
    const int undoSteps = w.document()->undoStack()->count();
    use->trigger();
    QCOMPARE(w.document()->undoStack()->count(), undoSteps + 1);
    {
      const ms::RunConfig& c = w.document()->config();
      QCOMPARE(int(c.mesh.profiles.size()), 1);
      QCOMPARE(c.mesh.profiles[0].name, std::string("this-machine"));
      QCOMPARE(QString::fromStdString(c.mesh.profiles[0].file), path);
      QVERIFY(QFileInfo(QString::fromStdString(c.mesh.profiles[0].file)).isAbsolute());
      QVERIFY(c.mesh.profiles[0].data);
      for (const ms::NodeConfig& n : c.mesh.nodes) QCOMPARE(n.device, std::string("this-machine"));
      QCOMPARE(c.mesh.intraLink, std::string("this-machine.shm"));
      QCOMPARE(c.mesh.interLink, std::string("this-machine.tcp"));
      QVERIFY2(w.document()->errors().empty(),
               ms::formatConfigErrors(w.document()->errors(), c.name).c_str());
    }
    QVERIFY(waitForSnapshot(w));
    QVERIFY2(w.snapshot()->ok(), qPrintable(w.snapshot()->error));
    QVERIFY(w.snapshot()->sim.stepTime > 0);
    QVERIFY(std::isfinite(w.snapshot()->sim.stepTime));

    // Undo restores the mesh as it was; redo puts the profile back.
    w.document()->undoStack()->undo();
    QVERIFY(w.document()->config().mesh == before.mesh);
    for (const ms::NodeConfig& n : w.document()->config().mesh.nodes) QCOMPARE(n.device, std::string("cpu"));
    QCOMPARE(w.document()->config().mesh.intraLink, before.mesh.intraLink);
    QVERIFY(w.document()->config().mesh.profiles.empty());
    w.document()->undoStack()->redo();
    QCOMPARE(w.document()->config().mesh.nodes[0].device, std::string("this-machine"));

    // Using it again changes nothing to undo.
    use->trigger();
    QCOMPARE(w.document()->undoStack()->count(), undoSteps + 1);
    QVERIFY(w.document()->config().mesh.profiles[0].data);
    // A profile that also measured the link between two hosts (calibrate --hosts: "net") puts it between the
    // nodes instead of TCP on one host.
    {
      QFile f(path);
      QVERIFY(f.open(QIODevice::ReadOnly));
      nlohmann::json j = nlohmann::json::parse(f.readAll().toStdString());
      f.close();
      for (const nlohmann::json& l : nlohmann::json(j["links"]))
        if (l["name"] == "tcp") {
          nlohmann::json net = l;
          net["name"] = "net";
          j["links"].push_back(net);
        }
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(QByteArray::fromStdString(j.dump()));
    }
    use->trigger();
    QCOMPARE(w.document()->config().mesh.interLink, std::string("this-machine.net"));
    QCOMPARE(w.document()->config().mesh.intraLink, std::string("this-machine.shm"));
  }

  // Cancel in the dialog stops the engine; nothing is written.
  void cancelStopsTheEngine() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    w.setProfilesFolder(dir.path() + "/profiles");
    w.engineClient()->setEnginePath(MS_ENGINE_EXE);
    w.setCalibrateArguments({});  // the full run: far longer than the wait for its first line
    QSignalSpy progress(w.calibrateJob(), &ms::CalibrateJob::progress);
    QSignalSpy finished(w.calibrateJob(), &ms::CalibrateJob::finished);
    QVERIFY(w.calibrateThisMachine());
    QTRY_VERIFY_WITH_TIMEOUT(progress.count() >= 1 || finished.count() == 1, kCalibrateTimeoutMs);
    QCOMPARE(finished.count(), 0);
    auto* cancel = w.calibrateDialog()->findChild<QPushButton*>();
    QVERIFY(cancel);
    cancel->click();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 10000);
    QVERIFY(!finished.at(0).at(0).toBool());
    QVERIFY(w.calibrateJob()->wasCancelled());
    QVERIFY2(finished.at(0).at(1).toString().contains("cancelled"),
             qPrintable(finished.at(0).at(1).toString()));
    QVERIFY(w.lastError().isEmpty());  // a cancel is not an error
    QVERIFY(w.statusBar()->currentMessage().contains("cancelled"));
    QVERIFY(!w.calibrateDialog()->isVisible());
    QVERIFY(!QFileInfo::exists(w.thisMachineProfilePath()));
    QVERIFY(!QFileInfo::exists(w.thisMachineProfilePath() + ".tmp"));
  }

  // No engine where the studio looks: the error is shown (status bar, no modal box), no profile appears.
  void missingEngineFails() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    w.setProfilesFolder(dir.path() + "/profiles");
    w.setCalibrateArguments({"--quick"});
    w.engineClient()->setEnginePath(dir.path() + "/no-such-engine");
    QSignalSpy finished(w.calibrateJob(), &ms::CalibrateJob::finished);
    action(w, "calibrateMachineAction")->trigger();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 10000);
    QVERIFY(!finished.at(0).at(0).toBool());
    QVERIFY2(w.lastError().contains("no-such-engine"), qPrintable(w.lastError()));
    QVERIFY(w.statusBar()->currentMessage().contains("Calibration failed"));
    QVERIFY(!w.calibrateDialog()->isVisible());
    QVERIFY(QApplication::activeModalWidget() == nullptr);
    QVERIFY(!QFileInfo::exists(w.thisMachineProfilePath()));
    QVERIFY(action(w, "calibrateMachineAction")->isEnabled());
    QVERIFY(!action(w, "useMachineProfileAction")->isEnabled());
  }

  // A profiles folder that cannot be made (a file stands in its way): refused before the engine starts.
  void unmakeableFolderFails() {
    QTemporaryDir dir;
    QFile blocker(dir.path() + "/blocker");
    QVERIFY(blocker.open(QIODevice::WriteOnly));
    blocker.close();
    ms::MainWindow w;
    w.show();
    w.setProfilesFolder(dir.path() + "/blocker/profiles");
    QVERIFY(!w.calibrateThisMachine());
    QVERIFY(!w.calibrateJob()->isRunning());
    QVERIFY2(w.lastError().contains(dir.path() + "/blocker/profiles"), qPrintable(w.lastError()));
    QVERIFY(!w.calibrateDialog());
    QVERIFY(!QFileInfo::exists(w.thisMachineProfilePath()));
  }

  // The engine refuses an output it cannot write (FILE.tmp is a folder): its reason reaches the studio.
  void engineRefusesTheOutput() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    w.setProfilesFolder(dir.path() + "/profiles");
    w.setCalibrateArguments({"--quick"});
    w.engineClient()->setEnginePath(MS_ENGINE_EXE);
    const QString path = w.thisMachineProfilePath();
    QVERIFY(QDir().mkpath(path + ".tmp"));
    QSignalSpy finished(w.calibrateJob(), &ms::CalibrateJob::finished);
    QVERIFY(w.calibrateThisMachine());
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, kCalibrateTimeoutMs);
    QVERIFY(!finished.at(0).at(0).toBool());
    QVERIFY2(w.lastError().contains(QFileInfo(path).fileName() + ".tmp"), qPrintable(w.lastError()));
    QVERIFY(!QFileInfo::exists(path));
  }

  // A profile file that does not read: the error names the file, the project is untouched.
  void badProfileIsRefused() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    QVERIFY(QDir().mkpath(dir.path() + "/profiles"));
    w.setProfilesFolder(dir.path() + "/profiles");
    QFile bad(w.thisMachineProfilePath());
    QVERIFY(bad.open(QIODevice::WriteOnly));
    bad.write("{\"format\": \"meshstudio-device-profile\", \"version\": 7}");
    bad.close();
    w.setProfilesFolder(dir.path() + "/profiles");  // the action looks again
    QVERIFY(action(w, "useMachineProfileAction")->isEnabled());
    const ms::RunConfig before = w.document()->config();
    const int undoSteps = w.document()->undoStack()->count();
    action(w, "useMachineProfileAction")->trigger();
    QVERIFY2(w.lastError().contains(w.thisMachineProfilePath()), qPrintable(w.lastError()));
    QVERIFY(w.document()->config() == before);
    QCOMPARE(w.document()->undoStack()->count(), undoSteps);
  }
};

QTEST_MAIN(TestUiCalibrate)
#include "tst_ui_calibrate.moc"
