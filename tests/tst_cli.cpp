// The engine's command line, run as a real process: validate on every broken config (path-and-reason error,
// exit 2, never a crash), the examples validate, train/eval/dump end to end on a tiny text run, and bad data
// or bad usage give clear messages and the documented exit codes (0 ok, 1 run failed, 2 usage or config).
#include <QtTest>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include "test_util.h"

#include <QRegularExpression>

#include "runtime/checkpoint.h"
#include "runtime/file_io.h"

#include <fstream>

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);

struct Result {
  int code = -1;
  bool crashed = false;
  QString out;
  QString err;
};

Result engine(const QStringList& args, const QString& cwd = {},
              const QProcessEnvironment& env = QProcessEnvironment::systemEnvironment()) {
  QProcess p;
  p.setProcessEnvironment(env);
  if (!cwd.isEmpty()) p.setWorkingDirectory(cwd);
  p.start(kEngine, args);
  Result r;
  if (!p.waitForFinished(300000)) {
    p.kill();
    r.crashed = true;
    return r;
  }
  r.crashed = p.exitStatus() != QProcess::NormalExit;
  r.code = p.exitCode();
  r.out = QString::fromUtf8(p.readAllStandardOutput());
  r.err = QString::fromUtf8(p.readAllStandardError());
  return r;
}

QString tinyGpt(const QString& dir, const QString& textFile) {
  const QString path = dir + "/tiny.json";
  std::ofstream(path.toStdString())
      << "{\"version\": 1, \"name\": \"tiny\", \"seed\": 2,"
         " \"model\": {\"type\": \"gpt\", \"layers\": 1, \"width\": 16, \"heads\": 2, \"context\": 16},"
         " \"data\": {\"kind\": \"text\", \"files\": [\""
      << textFile.toStdString()
      << "\"]},"
         " \"training\": {\"steps\": 4, \"batch_size\": 2, \"seq_len\": 16, \"threads\": 1, "
         "\"eval_batches\": 2}}";
  return path;
}

// The metrics stream's records of one type, in order.
QList<QJsonObject> records(const QString& path, const QString& type) {
  QList<QJsonObject> out;
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return out;
  for (const QByteArray& line : f.readAll().split('\n')) {
    const QJsonObject o = QJsonDocument::fromJson(line).object();
    if (o.value("type").toString() == type) out << o;
  }
  return out;
}

}  // namespace

class TestCli : public QObject {
  Q_OBJECT
 private slots:
  void brokenConfigsAreRefused_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("reason");
    QFile expected(MS_TEST_DATA_DIR "/broken/expected.txt");
    QVERIFY(expected.open(QIODevice::ReadOnly));
    int rows = 0;
    while (!expected.atEnd()) {
      const QString line = QString::fromUtf8(expected.readLine()).trimmed();
      if (line.isEmpty() || line.startsWith('#')) continue;
      const QStringList parts = line.split('\t');
      QVERIFY2(parts.size() == 3, qPrintable(line));
      QTest::newRow(qPrintable(parts[0])) << parts[0] << parts[1] << parts[2];
      ++rows;
    }
    QVERIFY(rows >= 20);
  }
  void brokenConfigsAreRefused() {
    QFETCH(QString, file);
    QFETCH(QString, path);
    QFETCH(QString, reason);
    const QString config = QString(MS_TEST_DATA_DIR "/broken/") + file;
    for (const char* command : {"validate", "train", "eval", "dump", "plan", "autoplan"}) {
      QStringList args{command, config};
      if (QString(command) == "eval")
        args << "--checkpoint"
             << "/nonexistent";
      if (QString(command) == "dump") args << "--out" << QDir::tempPath() + "/ms-never-written";
      const Result r = engine(args);
      QVERIFY2(!r.crashed, command);
      QCOMPARE(r.code, 2);
      QVERIFY2(r.err.contains(file), qPrintable(r.err));
      if (!path.isEmpty() && path != "-") QVERIFY2(r.err.contains(path), qPrintable(r.err));
      QVERIFY2(r.err.contains(reason), qPrintable(r.err));
    }
  }

  void examplesValidate() {
    const QDir dir(MS_SOURCE_DIR "/resources/examples");
    const QStringList files = dir.entryList({"*.json"}, QDir::Files);
    QVERIFY(files.size() >= 3);
    QStringList args{"validate"};
    for (const QString& f : files) args << dir.filePath(f);
    const Result r = engine(args);
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QCOMPARE(r.out.count(": ok"), files.size());
  }

  void trainEvalDump() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int i = 0; i < 100; ++i) out << "to be or not to be, that is the question " << i << "\n";
    }
    const QString config = tinyGpt(tmp.path(), text);
    const Result t = engine({"train", config, "--metrics", "-", "--run-dir", tmp.path() + "/run", "--quiet"});
    QVERIFY2(t.code == 0, qPrintable(t.err));
    // stdout is the metrics stream: one JSON object per line, first run_start, last run_end.
    const QStringList lines = t.out.split('\n', Qt::SkipEmptyParts);
    QVERIFY(lines.size() >= 4 * 3 + 2);
    QVERIFY(lines.first().contains("\"type\":\"run_start\""));
    QVERIFY(lines.last().contains("\"type\":\"run_end\""));
    QVERIFY(lines.last().contains("\"status\":\"ok\""));
    // "device" defaults to "auto": one line says what it found and that the run is on the CPU (on this
    // machine: no driver or device, or an engine built without CUDA), on stderr and in the stream.
    QCOMPARE(t.err.count("device \"auto\": "), 1);
    QVERIFY2(t.err.contains("; training on the CPU"), qPrintable(t.err));
    QCOMPARE(t.out.count("device \\\"auto\\\": "), 1);
    const QString ckpt = tmp.path() + "/run/checkpoints/step-00000004";
    const Result e = engine({"eval", config, "--checkpoint", ckpt});
    QVERIFY2(e.code == 0, qPrintable(e.err));
    QVERIFY(e.out.contains("eval loss"));
    // The same folder again is refused without --resume/--overwrite; --resume with nothing left is fine.
    const Result again = engine({"train", config, "--run-dir", tmp.path() + "/run", "--quiet"});
    QCOMPARE(again.code, 1);
    QVERIFY(again.err.contains("already holds checkpoints"));
    const Result resumed = engine({"train", config, "--run-dir", tmp.path() + "/run", "--resume", "--quiet"});
    QVERIFY2(resumed.code == 0, qPrintable(resumed.err));
    const Result d = engine({"dump", config, "--out", tmp.path() + "/dump", "--checkpoint", ckpt});
    QVERIFY2(d.code == 0, qPrintable(d.err));
    QVERIFY(QFile::exists(tmp.path() + "/dump/outputs.safetensors"));
  }

  // A checkpoint carries manifest.json (each file's size and SHA-256, the step), and loading checks it before
  // reading (issue 18): flipped bytes in the weights, an edited state.json, a corrupted optimizer file or a
  // deleted state.json are each refused naming the file, by eval and by --resume; --resume never steps back
  // to an older checkpoint on its own, it names the newest whole one instead. Before, 4096 flipped bytes
  // changed the eval loss with exit 0 and a deleted state.json fell back to an older checkpoint silently.
  void damagedCheckpointsAreRefused_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("damage");
    QTest::addColumn<QString>("message");
    QTest::newRow("flipped weights") << "model.safetensors"
                                     << "flip"
                                     << "model.safetensors: damaged: its SHA-256";
    QTest::newRow("edited state") << "state.json"
                                  << "step"
                                  << "state.json: damaged: its SHA-256";
    QTest::newRow("corrupted optimizer") << "optimizer.safetensors"
                                         << "flip"
                                         << "optimizer.safetensors: damaged: its SHA-256";
    QTest::newRow("cut optimizer") << "optimizer.safetensors"
                                   << "cut"
                                   << "optimizer.safetensors: damaged: ";
    QTest::newRow("deleted state") << "state.json"
                                   << "delete"
                                   << "state.json: listed in the checkpoint's manifest";
    QTest::newRow("deleted manifest") << "manifest.json"
                                      << "delete"
                                      << "no manifest.json: not a complete checkpoint";
  }
  void damagedCheckpointsAreRefused() {
    QFETCH(QString, file);
    QFETCH(QString, damage);
    QFETCH(QString, message);
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int i = 0; i < 100; ++i) out << "to be or not to be, that is the question " << i << "\n";
    }
    QString config = tinyGpt(tmp.path(), text);
    {  // a checkpoint every 2 steps: step-00000002 and step-00000004
      QFile f(config);
      QVERIFY(f.open(QIODevice::ReadOnly));
      QByteArray body = f.readAll();
      f.close();
      body.replace("\"eval_batches\": 2", "\"eval_batches\": 2, \"checkpoint_every\": 2");
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(body);
    }
    const QString run = tmp.path() + "/run";
    const Result t = engine({"train", config, "--run-dir", run, "--quiet"});
    QVERIFY2(t.code == 0, qPrintable(t.err));
    const QString older = run + "/checkpoints/step-00000002", newest = run + "/checkpoints/step-00000004";
    QVERIFY(QFile::exists(newest + "/manifest.json") && QFile::exists(older + "/manifest.json"));
    const Result whole = engine({"eval", config, "--checkpoint", newest, "--json"});
    QVERIFY2(whole.code == 0, qPrintable(whole.err));

    const std::string path = (newest + "/" + file).toStdString();
    if (damage == "delete") {
      QVERIFY(QFile::remove(QString::fromStdString(path)));
    } else {
      std::string bytes = ms::test::readBytes(path);
      QVERIFY(damage == "step" || bytes.size() > 8192);
      if (damage == "flip")
        for (size_t i = bytes.size() / 2; i < std::min(bytes.size(), bytes.size() / 2 + 4096); ++i)
          bytes[i] ^= 0x5a;
      else if (damage == "cut")
        bytes.resize(bytes.size() - 8);
      else {  // state.json's step, 4 -> 1
        const size_t at = bytes.find("\"step\": 4");
        QVERIFY(at != std::string::npos);
        bytes.replace(at, 9, "\"step\": 1");
      }
      ms::test::writeBytes(path, bytes);
    }
    const Result e = engine({"eval", config, "--checkpoint", newest});
    if (file == "model.safetensors") {  // eval reads the weights only
      QCOMPARE(e.code, 1);
      QVERIFY2(e.err.contains(message), qPrintable(e.err));
    }
    const Result r = engine({"train", config, "--run-dir", run, "--resume", "--quiet", "--steps", "6"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
    QVERIFY2(r.err.contains("the newest whole one is " + older), qPrintable(r.err));
    QVERIFY(!QFile::exists(run + "/checkpoints/step-00000006"));
    // A run shorter than the checkpoint is refused, not silently a no-op.
    const Result past =
        engine({"train", config, "--run-dir", run, "--resume", older, "--steps", "1", "--quiet"});
    QCOMPARE(past.code, 1);
    QVERIFY2(past.err.contains(older + " is at step 2, past the run's 1 steps"), qPrintable(past.err));
    // Resuming from the whole one, named, works.
    const Result named =
        engine({"train", config, "--run-dir", run, "--resume", older, "--quiet", "--overwrite"});
    QVERIFY2(named.code == 0, qPrintable(named.err));
  }

  // A full disk ends the run at once (issue 18), not at its end: a metrics stream that cannot be written
  // (the sink /dev/full) stops the run after the step whose line failed, naming the file and the reason; in a
  // run folder on a full file system (a 1 MiB tmpfs), the failed write names its path, no half checkpoint is
  // left, and the error says where the newest complete checkpoint is, which loads. "keep_checkpoints" keeps
  // a long run within the same space. Before, training went on to the end and lost every weight.
  void fullDiskEndsTheRun() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int i = 0; i < 100; ++i) out << "to be or not to be, that is the question " << i << "\n";
    }
    QString config = tinyGpt(tmp.path(), text);
    const Result full =
        engine({"train", config, "--steps", "200", "--metrics", "/dev/full", "--run-dir", tmp.path() + "/a"});
    QCOMPARE(full.code, 1);
    QVERIFY2(full.err.contains("writing metrics to /dev/full: No space left on device"),
             qPrintable(full.err));
    const QList<QJsonObject> ends = records(tmp.path() + "/a/metrics.jsonl", "run_end");
    QCOMPARE(ends.size(), 1);
    QCOMPARE(ends[0].value("step").toInt(), 0);  // run_start's line failed: nothing was trained
    QVERIFY(ends[0].value("reason").toString().contains("/dev/full: No space left on device"));

    // A small file system for the run folder.
    const QString mnt = tmp.path() + "/small";
    QDir().mkpath(mnt);
    QProcess mount;
    mount.start("mount", {"-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt});
    if (!mount.waitForFinished(10000) || mount.exitCode() != 0)
      QSKIP(qPrintable("cannot mount a tmpfs here (root and mount(2) needed): " +
                       mount.readAllStandardError()));
    struct Unmount {
      QString dir;
      ~Unmount() { QProcess::execute("umount", {dir}); }
    } unmount{mnt};
    {
      QFile f(config);
      QVERIFY(f.open(QIODevice::ReadOnly));
      QByteArray body = f.readAll();
      f.close();
      body.replace("\"eval_batches\": 2", "\"eval_batches\": 1, \"checkpoint_every\": 1");
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(body);
    }
    const QString run = mnt + "/run";
    const Result r = engine({"train", config, "--steps", "400", "--run-dir", run, "--quiet"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains("No space left on device"), qPrintable(r.err));
    QVERIFY2(r.err.contains(run), qPrintable(r.err));
    const int at = r.err.indexOf("the newest complete checkpoint is ");
    QVERIFY2(at >= 0, qPrintable(r.err));
    const QString good = r.err.mid(at + 34).section(QRegularExpression("[;\\s]"), 0, 0);
    QVERIFY2(good.startsWith(run + "/checkpoints/step-"), qPrintable(good));
    QVERIFY2(ms::verifyCheckpoint(good.toStdString(), ms::kResumeFiles).isOk(), qPrintable(good));
    for (const QString& name : QDir(run + "/checkpoints").entryList(QDir::Dirs | QDir::NoDotAndDotDot))
      QVERIFY2(!name.contains('.'), qPrintable(name));  // no .partial or .old left
    const Result e = engine({"eval", config, "--checkpoint", good});
    QVERIFY2(e.code == 0, qPrintable(e.err));

    // keep_checkpoints 2: the same run fits, and ends with its two newest checkpoints.
    QProcess::execute("rm", {"-rf", run});
    {
      QFile f(config);
      QVERIFY(f.open(QIODevice::ReadOnly));
      QByteArray body = f.readAll();
      f.close();
      body.replace("\"checkpoint_every\": 1",
                   "\"checkpoint_every\": 1, \"keep_checkpoints\": 2, \"log_every\": 50");
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(body);
    }
    const Result k = engine({"train", config, "--steps", "400", "--run-dir", run, "--quiet"});
    QVERIFY2(k.code == 0, qPrintable(k.err));
    QCOMPARE(QDir(run + "/checkpoints").entryList(QDir::Dirs | QDir::NoDotAndDotDot),
             (QStringList{"step-00000399", "step-00000400"}));
  }

  // Every failure of train reaches its metrics stream as a run_end (issue 18), those before the stream began
  // too: a config that does not load (to stdout with --metrics -) and an option out of range (appended to a
  // --metrics file). Before, the README's promise held only once training had started.
  void startupFailuresReachTheStream() {
    const QString broken = QString(MS_TEST_DATA_DIR "/broken/") + "tp_not_dividing_heads.json";
    const Result r = engine({"train", broken, "--metrics", "-"});
    QCOMPARE(r.code, 2);
    const QStringList lines = r.out.split('\n', Qt::SkipEmptyParts);
    QCOMPARE(lines.size(), 1);
    const QJsonObject end = QJsonDocument::fromJson(lines.last().toUtf8()).object();
    QCOMPARE(end.value("type").toString(), QString("run_end"));
    QCOMPARE(end.value("status").toString(), QString("error"));
    QVERIFY2(end.value("reason").toString().contains("tp_not_dividing_heads.json"), qPrintable(lines.last()));

    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    std::ofstream(text.toStdString()) << "a few words to train on\n";
    const QString file = tmp.path() + "/m.jsonl";
    const Result s = engine({"train", tinyGpt(tmp.path(), text), "--metrics", file, "--steps", "2147483648"});
    QCOMPARE(s.code, 2);
    const QList<QJsonObject> ends = records(file, "run_end");
    QCOMPARE(ends.size(), 1);
    QVERIFY2(ends[0].value("reason").toString().contains("--steps needs an integer from 0 to 2147483647"),
             qPrintable(ends[0].value("reason").toString()));

    // launch's own failures reach `-- --metrics -` too: a config that does not load, a stall timeout out of
    // range, and a run folder another run holds (the first run's lock; nothing is written to its metrics).
    const Result l = engine({"launch", broken, "--", "--metrics", "-"});
    QCOMPARE(l.code, 2);
    QCOMPARE(l.out.count("\"type\":\"run_end\""), 1);
    QVERIFY2(l.out.contains("tp_not_dividing_heads.json"), qPrintable(l.out));
    const Result st =
        engine({"launch", tinyGpt(tmp.path(), text), "--stall-timeout", "1e400", "--", "--metrics", "-"});
    QCOMPARE(st.code, 2);
    QVERIFY2(st.out.contains("--stall-timeout needs a number of seconds from 0 (the watch off) to 86400"),
             qPrintable(st.out + st.err));
    const QString runDir = tmp.path() + "/locked";
    QVERIFY(QDir().mkpath(runDir));
    ms::RunFolderLock holder;
    QVERIFY(holder.acquire(runDir.toStdString()).isOk());
    const Result locked =
        engine({"launch", tinyGpt(tmp.path(), text), "--", "--metrics", "-", "--run-dir", runDir});
    QCOMPARE(locked.code, 1);
    const QStringList lockedLines = locked.out.split('\n', Qt::SkipEmptyParts);
    QCOMPARE(lockedLines.size(), 1);
    const QJsonObject lockedEnd = QJsonDocument::fromJson(lockedLines[0].toUtf8()).object();
    QCOMPARE(lockedEnd.value("type").toString(), QString("run_end"));
    QVERIFY2(lockedEnd.value("reason").toString().contains("in use by"), qPrintable(lockedLines[0]));
    QVERIFY(!QFileInfo::exists(runDir + "/metrics.jsonl"));
  }

  // A batch that cannot fit is refused before anything is allocated (issue 18: batch_size 1e8 passed
  // validation and died with a bare "out of memory" after 25 s): the plan's predicted memory of the rank
  // against what the machine has, naming the field, the estimate and what to change; the stream gets the
  // reason as its run_end.
  void hugeBatchIsRefusedUpFront() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int k = 0; k < 200; ++k)
        out << "Line " << k << " of a text a huge batch never gets to train on.\n";
    }
    const QString config = tinyGpt(tmp.path(), text);
    QString body;
    {
      QFile f(config);
      QVERIFY(f.open(QIODevice::ReadOnly));
      body = QString::fromUtf8(f.readAll());
    }
    body.replace("\"batch_size\": 2", "\"batch_size\": 100000000");
    {
      QFile f(config);
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(body.toUtf8());
    }
    QElapsedTimer t;
    t.start();
    const Result r = engine({"train", config, "--metrics", "-", "--run-dir", tmp.path() + "/run"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains("/training/batch_size: rank 0 needs an estimated ") &&
                 r.err.contains("for microbatches of 100000000 samples") &&
                 r.err.contains("more than the ") && r.err.contains("lower training.batch_size"),
             qPrintable(r.err));
    QVERIFY2(!r.err.contains("out of memory"), qPrintable(r.err));
    QVERIFY2(r.out.contains("\"type\":\"run_end\"") && r.out.contains("/training/batch_size"),
             qPrintable(r.out));
    qInfo("refused after %.1f s: %s", t.elapsed() / 1000.0, qPrintable(r.err.trimmed()));
  }

  // Every integer option is range-checked before use (issue 18): a value beyond int's range, beyond long
  // long's, negative where it cannot be, or not a number exits 2 with the option and its range named, and
  // runs nothing (no run folder). Before, "--steps 2147483648" wrapped to -2147483648 and exited 0 having
  // trained nothing.
  void integerOptionsAreRangeChecked_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    const QString steps = "--steps needs an integer from 0 to 2147483647";
    QTest::newRow("steps 2^31") << QStringList{"train", "--steps", "2147483648"} << steps;
    QTest::newRow("steps 2^64") << QStringList{"train", "--steps", "18446744073709551616"} << steps;
    QTest::newRow("steps -1") << QStringList{"train", "--steps", "-1"} << steps;
    QTest::newRow("steps 1e3") << QStringList{"train", "--steps", "1e3"} << steps;
    QTest::newRow("stop-after 2^63") << QStringList{"train", "--stop-after", "9223372036854775808"}
                                     << "--stop-after (a step) needs an integer from 1 to 2147483647";
    QTest::newRow("eval batches -3") << QStringList{"eval", "--checkpoint", "x", "--batches", "-3"}
                                     << "--batches needs an integer from 0 to 2147483647";
    QTest::newRow("dump samples 0") << QStringList{"dump", "--out", "x", "--samples", "0"}
                                    << "--samples needs an integer from 1 to 2147483647";
    QTest::newRow("dump step 2^31") << QStringList{"dump", "--out", "x", "--step", "2147483648"}
                                    << "--step needs an integer from 0 to 2147483647";
    QTest::newRow("autoplan top 101")
        << QStringList{"autoplan", "--top", "101"} << "--top needs an integer from 1 to 100";
  }
  void integerOptionsAreRangeChecked() {
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    std::ofstream(text.toStdString()) << "a few words to train on\n";
    const QString run = tmp.path() + "/run";
    args.insert(1, tinyGpt(tmp.path(), text));
    if (args[0] == "train") args << "--run-dir" << run;
    const Result r = engine(args);
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
    QVERIFY(!QFileInfo::exists(run));
  }

  // train --stop-after STEP runs the first STEP steps of the config's run as they are in the whole run (same
  // learning-rate schedule, unlike --steps, which shortens it), ends with run_end "interrupted", exit 0 and a
  // checkpoint, and --resume goes on to the end as if never stopped.
  void stopAfterKeepsTheSchedule() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int i = 0; i < 100; ++i) out << "to be or not to be, that is the question " << i << "\n";
    }
    const QString config = tinyGpt(tmp.path(), text);  // 4 steps, cosine decay from step 1
    const QString whole = tmp.path() + "/whole.jsonl", part = tmp.path() + "/part.jsonl";
    const Result w =
        engine({"train", config, "--metrics", whole, "--run-dir", tmp.path() + "/whole", "--quiet"});
    QVERIFY2(w.code == 0, qPrintable(w.err));
    const Result p = engine({"train", config, "--stop-after", "2", "--metrics", part, "--run-dir",
                             tmp.path() + "/part", "--quiet"});
    QVERIFY2(p.code == 0, qPrintable(p.err));
    QVERIFY2(p.err.contains("stopped after step 2 as asked (--stop-after)"), qPrintable(p.err));
    QVERIFY(QFile::exists(tmp.path() + "/part/checkpoints/step-00000002/model.safetensors"));
    const Result shortened =
        engine({"train", config, "--steps", "2", "--metrics", tmp.path() + "/steps.jsonl", "--run-dir",
                tmp.path() + "/steps", "--quiet"});
    QVERIFY2(shortened.code == 0, qPrintable(shortened.err));
    const Result resumed = engine(
        {"train", config, "--resume", "--metrics", part, "--run-dir", tmp.path() + "/part", "--quiet"});
    QVERIFY2(resumed.code == 0, qPrintable(resumed.err));

    const QList<QJsonObject> wholeSteps = records(whole, "step"), partSteps = records(part, "step");
    QCOMPARE(wholeSteps.size(), 4);
    QCOMPARE(partSteps.size(), 4);  // 2 before the stop, 2 after --resume (the stream is appended to)
    for (int i = 0; i < 4; ++i) {
      QCOMPARE(partSteps[i].value("step").toInt(), i + 1);
      QCOMPARE(partSteps[i].value("lr").toDouble(), wholeSteps[i].value("lr").toDouble());
      QCOMPARE(partSteps[i].value("loss").toDouble(), wholeSteps[i].value("loss").toDouble());
    }
    const QList<QJsonObject> ends = records(part, "run_end");
    QCOMPARE(ends.size(), 2);
    QCOMPARE(ends[0].value("status").toString(), QString("interrupted"));
    QCOMPARE(ends[0].value("step").toInt(), 2);
    QCOMPARE(ends[1].value("status").toString(), QString("ok"));
    // --steps 2 is another schedule: its second step's learning rate is the floor, the whole run's is not.
    const QList<QJsonObject> shortSteps = records(tmp.path() + "/steps.jsonl", "step");
    QCOMPARE(shortSteps.size(), 2);
    QVERIFY(shortSteps[1].value("lr").toDouble() < wholeSteps[1].value("lr").toDouble());

    const Result zero = engine({"train", config, "--stop-after", "0", "--run-dir", tmp.path() + "/zero"});
    QCOMPARE(zero.code, 2);
    QVERIFY2(zero.err.contains("--stop-after (a step) needs an integer from 1 to"), qPrintable(zero.err));
  }

  // "device": "cuda" trains on a GPU or says why it cannot (no driver or device here), naming /device, and
  // writes no run; --emulate-device runs the device code path on the CPU and says so once, for train and
  // dump.
  void deviceChoice() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    {
      std::ofstream out(text.toStdString());
      for (int i = 0; i < 50; ++i) out << "a device for every rank " << i << "\n";
    }
    QString config = tinyGpt(tmp.path(), text);
    QFile f(config);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QString body = QString::fromUtf8(f.readAll());
    f.close();
    body.replace("\"seed\": 2,", "\"seed\": 2, \"device\": \"cuda\",");
    const QString cudaConfig = tmp.path() + "/cuda.json";
    std::ofstream(cudaConfig.toStdString()) << body.toStdString();
    const Result r = engine({"train", cudaConfig, "--run-dir", tmp.path() + "/cuda-run", "--quiet"});
    QVERIFY(!r.crashed);
    if (r.code == 0) {
      QVERIFY2(r.err.contains("device \"cuda\": training on "), qPrintable(r.err));  // a GPU machine
    } else {
      QCOMPARE(r.code, 1);
      QVERIFY2(r.err.contains("/device: \"cuda\": no usable CUDA device ("), qPrintable(r.err));
      QVERIFY(!QFile::exists(tmp.path() + "/cuda-run/metrics.jsonl"));
#ifdef MS_HAVE_CUDA_PLUGIN
      // The CUDA plugin (engine/runtime/cuda_plugin.h) opened, every symbol resolved against the engine,
      // and CUDA itself gave the reason; a plugin that is not there is named.
      QVERIFY2(!r.err.contains("plugin"), qPrintable(r.err));
      QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
      env.insert("MESHSTUDIO_CUDA_PLUGIN", tmp.path() + "/nowhere/libmeshstudio_cuda.so");
      const Result missing = engine({"train", cudaConfig, "--run-dir", tmp.path() + "/cuda-run"}, {}, env);
      QCOMPARE(missing.code, 1);
      QVERIFY2(missing.err.contains("the CUDA plugin is missing (looked for " + tmp.path() +
                                    "/nowhere/libmeshstudio_cuda.so)"),
               qPrintable(missing.err));
#else
      QVERIFY2(r.err.contains("this engine was built without CUDA"), qPrintable(r.err));
#endif
      const Result e =
          engine({"train", cudaConfig, "--run-dir", tmp.path() + "/cuda-run", "--emulate-device"});
      QCOMPARE(e.code, 1);
      QVERIFY2(e.err.contains("--emulate-device emulates a device on the CPU"), qPrintable(e.err));
    }
    const Result emu = engine({"train", config, "--metrics", "-", "--run-dir", tmp.path() + "/emu-run",
                               "--quiet", "--emulate-device"});
    QVERIFY2(emu.code == 0, qPrintable(emu.err));
    QCOMPARE(emu.err.count("the emulated device on the CPU"), 1);
    const Result plain =
        engine({"train", config, "--metrics", "-", "--run-dir", tmp.path() + "/plain-run", "--quiet"});
    QVERIFY2(plain.code == 0, qPrintable(plain.err));
    auto losses = [](const QString& out) {
      QStringList l;
      for (const QString& line : out.split('\n'))
        if (line.contains("\"type\":\"step\"")) l << line.section("\"loss\":", 1).section(',', 0, 0);
      return l;
    };
    QCOMPARE(losses(emu.out).size(), 4);
    QCOMPARE(losses(emu.out), losses(plain.out));
    // dump runs on the device too: through the emulated device its logits, loss and gradients are the plain
    // CPU's byte for byte (the files differ if any tensor does).
    const Result dEmu = engine({"dump", config, "--out", tmp.path() + "/dump-emu", "--emulate-device"});
    QVERIFY2(dEmu.code == 0, qPrintable(dEmu.err));
    const Result dPlain = engine({"dump", config, "--out", tmp.path() + "/dump-plain"});
    QVERIFY2(dPlain.code == 0, qPrintable(dPlain.err));
    auto bytes = [](const QString& path) {
      QFile file(path);
      return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
    };
    const QByteArray a = bytes(tmp.path() + "/dump-emu/outputs.safetensors");
    QVERIFY(a.size() > 1000);
    QVERIFY(a == bytes(tmp.path() + "/dump-plain/outputs.safetensors"));
  }

  void badDataIsNamed() {
    QTemporaryDir tmp;
    const QString config = tinyGpt(tmp.path(), tmp.path() + "/missing.txt");
    const Result r = engine({"train", config, "--run-dir", tmp.path() + "/run", "--quiet"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains("missing.txt"), qPrintable(r.err));
    // A checkpoint that is not one.
    const QString text = tmp.path() + "/t.txt";
    std::ofstream(text.toStdString()) << std::string(2000, 'a');
    const QString good = tinyGpt(tmp.path(), text);
    const Result e = engine({"eval", good, "--checkpoint", tmp.path()});
    QCOMPARE(e.code, 1);
    QVERIFY2(e.err.contains("model.safetensors"), qPrintable(e.err));
  }

  // A malformed MESHSTUDIO_HEAD_CHUNK_ROWS is refused by name before anything runs; a good one trains with
  // the config's training.head_chunk_rows set from it, as the run folder's config and the plan's predicted
  // memory show (the head's logits chunk: 3 rows of the 256-token vocabulary, against the automatic
  // whole-microbatch chunk without it).
  void headChunkRowsVariable() {
    QTemporaryDir tmp;
    const QString text = tmp.path() + "/t.txt";
    std::ofstream(text.toStdString()) << std::string(4000, 'b');
    const QString config = tinyGpt(tmp.path(), text);
    for (const char* bad : {"abc", "0", "-3", "12x"}) {
      qputenv("MESHSTUDIO_HEAD_CHUNK_ROWS", bad);
      const Result r = engine({"train", config, "--run-dir", tmp.path() + "/bad", "--quiet"});
      QVERIFY(!r.crashed);
      QCOMPARE(r.code, 2);
      QVERIFY2(r.err.contains("MESHSTUDIO_HEAD_CHUNK_ROWS") && r.err.contains(QString("'%1'").arg(bad)),
               qPrintable(r.err));
      QVERIFY(!QFile::exists(tmp.path() + "/bad/metrics.jsonl"));
    }
    const auto predictedOther = [&](const QString& dir) {
      const QList<QJsonObject> starts = records(dir + "/metrics.jsonl", "run_start");
      if (starts.isEmpty()) return -1.0;
      return starts.last()["predicted"]["ranks"][0]["memory_bytes"]["other"].toDouble(-1.0);
    };
    qputenv("MESHSTUDIO_HEAD_CHUNK_ROWS", "3");
    const Result ok = engine({"train", config, "--run-dir", tmp.path() + "/ok", "--quiet"});
    qunsetenv("MESHSTUDIO_HEAD_CHUNK_ROWS");
    QCOMPARE(ok.code, 0);
    QFile saved(tmp.path() + "/ok/config.json");
    QVERIFY(saved.open(QIODevice::ReadOnly));
    QCOMPARE(
        QJsonDocument::fromJson(saved.readAll()).object()["training"].toObject()["head_chunk_rows"].toInt(),
        3);
    const Result plain = engine({"train", config, "--run-dir", tmp.path() + "/plain", "--quiet"});
    QCOMPARE(plain.code, 0);
    QVERIFY2(predictedOther(tmp.path() + "/ok") > 0 &&
                 predictedOther(tmp.path() + "/ok") < predictedOther(tmp.path() + "/plain"),
             qPrintable(QString("other %1 with 3-row chunks, %2 without")
                            .arg(predictedOther(tmp.path() + "/ok"))
                            .arg(predictedOther(tmp.path() + "/plain"))));
  }

  void badUsage_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    QTest::newRow("no command") << QStringList{} << "no command";
    QTest::newRow("unknown command") << QStringList{"fly"} << "unknown command";
    QTest::newRow("unknown option") << QStringList{"train", "x.json", "--fast"} << "unknown option --fast";
    QTest::newRow("missing value") << QStringList{"train", "x.json", "--metrics"}
                                   << "--metrics needs a value";
    QTest::newRow("eval without checkpoint") << QStringList{"eval", "x.json"} << "--checkpoint";
    QTest::newRow("missing config") << QStringList{"validate", "/nonexistent/c.json"}
                                    << "/nonexistent/c.json";
  }
  void badUsage() {
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    const Result r = engine(args);
    QVERIFY(!r.crashed);
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
  }

  // `plan` on a 7.5B GPT over dp 64 (the ZeRO paper's example) prints the published bytes per parameter for
  // every ZeRO stage: the ZeRO paper's 16, 4 + 12/d, 2 + 14/d, 16/d with bf16 gradients and Megatron Core's
  // distributed-optimizer 18, 6 + 12/d (2 + 16/d, 18/d) with fp32 ones (plan/model_state.h). The same
  // figures as scripts/zero_table.py, which docs/plan-model.md quotes.
  void planShowsPublishedZeroBytes() {
    QFile file(MS_SOURCE_DIR "/scripts/configs/gpt-7.5b-64xa100.json");
    QVERIFY(file.open(QIODevice::ReadOnly));
    QJsonObject config = QJsonDocument::fromJson(file.readAll()).object();
    // GPT-2 layout, 36 blocks of width 4096, vocabulary 51200, 2048 positions, tied embeddings.
    const double L = 36, h = 4096, V = 51200, T = 2048, d = 64;
    const double psi = L * (12 * h * h + 13 * h) + V * h + T * h + 2 * h;
    const double zeroPaper[4] = {16, 4 + 12 / d, 2 + 14 / d, 16 / d};
    const double megatron[4] = {18, 6 + 12 / d, 2 + 16 / d, 18 / d};
    QTemporaryDir tmp;
    for (const char* grads : {"bf16", "fp32"})
      for (int zero = 0; zero <= 3; ++zero) {
        QJsonObject parallel = config["parallel"].toObject();
        parallel["zero"] = zero;
        parallel["grad_precision"] = grads;
        config["parallel"] = parallel;
        const QString path = tmp.path() + QString("/%1-%2.json").arg(grads).arg(zero);
        QFile out(path);
        QVERIFY(out.open(QIODevice::WriteOnly));
        out.write(QJsonDocument(config).toJson());
        out.close();
        const Result r = engine({"plan", path, "--json"});
        QVERIFY2(r.code == 0, qPrintable(r.err));
        const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
        const QJsonArray devices = j["devices"].toArray();
        QCOMPARE(devices.size(), 64);
        for (const auto& dev : devices) {
          const QJsonObject m = dev.toObject()["memory_bytes"].toObject();
          const double perParam =
              (m["parameters"].toDouble() + m["gradients"].toDouble() + m["optimizer"].toDouble()) / psi;
          const double want = std::string(grads) == "bf16" ? zeroPaper[zero] : megatron[zero];
          QVERIFY2(std::abs(perParam - want) < 1e-9 * want,
                   qPrintable(QString("%1 gradients, ZeRO-%2: %3 bytes per parameter, published %4")
                                  .arg(grads)
                                  .arg(zero)
                                  .arg(perParam, 0, 'g', 12)
                                  .arg(want, 0, 'g', 12)));
        }
      }
  }

  // plan --json has the documented shape and agrees with the table; --balance --write saves a placement that
  // validates.
  void planCommand() {
    const QString config = MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json";
    const Result r = engine({"plan", config, "--json"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
    for (const char* key : {"devices", "step_time_s", "tokens_per_s", "mfu", "fits"})
      QVERIFY2(j.contains(key), key);
    const QJsonArray devices = j["devices"].toArray();
    QCOMPARE(devices.size(), 1024);
    const QJsonObject d = devices[1023].toObject();
    for (const char* key :
         {"rank", "node", "device", "stage", "layers", "memory_bytes", "capacity_bytes", "bubble_fraction"})
      QVERIFY2(d.contains(key), key);
    QCOMPARE(d["rank"].toInt(), 1023);
    QCOMPARE(d["stage"].toInt(), 7);  // rank = (pp * dp + dp_i) * tp + tp_i with dp 16, tp 8
    QCOMPARE(d["node"].toString(), QString("node127"));
    const QJsonObject m = d["memory_bytes"].toObject();
    const double sum = m["parameters"].toDouble() + m["gradients"].toDouble() + m["optimizer"].toDouble() +
                       m["activations"].toDouble() + m["other"].toDouble();
    // The total is the most held at once: the categories' sum less what does not peak with the rest.
    QVERIFY(std::abs(sum - m["not_at_once"].toDouble() - m["total"].toDouble()) <= 1e-6 * sum);
    QVERIFY(m["total"].toDouble() <= sum);
    QVERIFY(j["fits"].toBool());
    QVERIFY(j["mfu"].toDouble() > 0 && j["mfu"].toDouble() < 1);
    // Each layer's times and, on the catalog H100, its forward kernel by kernel (96 blocks, the embedding and
    // the head; block.0's four GEMMs, attention and elementwise passes summing to its forward).
    const QJsonArray layers = j["layers"].toArray();
    QCOMPARE(layers.size(), 98);
    const QJsonObject block = layers[1].toObject();
    QCOMPARE(block["name"].toString(), QString("block.0"));
    QCOMPARE(block["stage"].toInt(), 0);
    QCOMPARE(layers[97].toObject()["stage"].toInt(), 7);
    const QJsonArray kernels = block["kernels"].toArray();
    QCOMPARE(kernels.size(), 6);
    double kernelSum = 0;
    for (const QJsonValue& k : kernels) kernelSum += k.toObject()["seconds"].toDouble();
    QVERIFY(std::abs(kernelSum - block["forward_s"].toDouble()) <= 1e-9 * kernelSum);
    QVERIFY(block["backward_s"].toDouble() > block["forward_s"].toDouble());
    QVERIFY(kernels[0].toObject()["what"].toString().startsWith("GEMM "));
    const double fraction = kernels[0].toObject()["fraction_of_peak"].toDouble();
    QVERIFY2(fraction > 0.3 && fraction <= 792.1 / 989.0, qPrintable(QString::number(fraction)));
    QTemporaryDir tmp;
    const QString out = tmp.path() + "/balanced.json";
    const Result b = engine({"plan", config, "--balance", "--write", out});
    QVERIFY2(b.code == 0, qPrintable(b.err));
    QVERIFY(b.out.contains("fits in memory on every device"));
    const Result v = engine({"validate", out});
    QVERIFY2(v.code == 0, qPrintable(v.err));
    QVERIFY(QFile(out).open(QIODevice::ReadOnly));
  }

  // import-hf: Mistral 7B's config.json as the model of the Llama 3 8B template (its mesh, data, parallel and
  // training kept, seq_len kept under the model's context), the approximation said on stderr; a
  // mixture-of-experts config, a broken file and a missing --base refused with the file and field named.
  void importHfCommand() {
    QTemporaryDir tmp;
    const QString base = MS_SOURCE_DIR "/resources/examples/llama3-8b-8xh100.json";
    const QString hf = MS_SOURCE_DIR "/tests/data/hf/mistral-7b.json";
    const QString out = tmp.path() + "/mistral.json";
    const Result r = engine({"import-hf", hf, "--base", base, "--name", "mistral-7b", "--out", out});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QVERIFY2(r.err.contains("mistral-7b.json: note: sliding_window 4096"), qPrintable(r.err));
    QFile f(out);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QJsonObject c = QJsonDocument::fromJson(f.readAll()).object();
    const QJsonObject m = c["model"].toObject();
    QCOMPARE(m["type"].toString(), QString("llama"));
    QCOMPARE(m["kv_heads"].toInt(), 8);
    QCOMPARE(m["vocab"].toInt(), 32000);
    QCOMPARE(c["name"].toString(), QString("mistral-7b"));
    QCOMPARE(c["parallel"].toObject()["zero"].toInt(), 3);
    const Result p = engine({"plan", out});
    QVERIFY2(p.code == 0, qPrintable(p.err));
    QVERIFY(p.out.contains("fits in memory on every device"));

    const QString deepseek = tmp.path() + "/deepseek.json";
    std::ofstream(deepseek.toStdString()) << "{\"model_type\": \"deepseek_v3\", \"n_routed_experts\": 256}";
    const Result moe = engine({"import-hf", deepseek, "--base", base});
    QCOMPARE(moe.code, 2);
    QVERIFY2(moe.err.contains("deepseek.json: /model_type: \"deepseek_v3\" is a mixture-of-experts model"),
             qPrintable(moe.err));
    const QString broken = tmp.path() + "/broken.json";
    std::ofstream(broken.toStdString()) << "{\"model_type\": \"llama\", \"hidden_size\": 64";
    const Result b = engine({"import-hf", broken, "--base", base});
    QCOMPARE(b.code, 2);
    QVERIFY2(b.err.contains("broken.json: not valid JSON"), qPrintable(b.err));
    const Result noBase = engine({"import-hf", hf});
    QCOMPARE(noBase.code, 2);
    QVERIFY(noBase.err.contains("import-hf needs --base CONFIG"));
    // The model must suit the base's data: GPT-2's 50257-token vocabulary is not the text data's bytes.
    const Result text = engine({"import-hf", MS_SOURCE_DIR "/tests/data/hf/gpt2.json", "--base",
                                MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json"});
    QCOMPARE(text.code, 2);
    QVERIFY2(text.err.contains("vocab must be 256"), qPrintable(text.err));
  }

  // export --target writes each framework's files; import reads them back to a plan the planner predicts
  // exactly as the original; what cannot be carried and bad input are said, with exit code 2.
  void frameworkExportImportCommands() {
    QTemporaryDir tmp;
    const QString config = MS_SOURCE_DIR "/resources/examples/llama3-70b-64xh100.json";
    const Result original = engine({"plan", config});
    QVERIFY2(original.code == 0, qPrintable(original.err));
    const auto stepLine = [](const QString& out) {
      for (const QString& line : out.split('\n'))
        if (line.startsWith("step ")) return line;
      return QString();
    };
    const QString step = stepLine(original.out);
    QVERIFY2(!step.isEmpty(), qPrintable(original.out));
    for (const QString target : {"megatron", "torchtitan", "deepspeed"}) {
      const Result ex = engine({"export", config, "--out", tmp.path(), "--target", target});
      QVERIFY2(ex.code == 0, qPrintable(target + ": " + ex.err));
      QStringList args = {"import"};
      if (target == "megatron") args << tmp.path() + "/megatron/pretrain_gpt.sh";
      if (target == "torchtitan")
        args << tmp.path() + "/torchtitan/train.toml" << tmp.path() + "/torchtitan/run.sh";
      if (target == "deepspeed")
        args << tmp.path() + "/deepspeed/ds_config.json"
             << "--model" << tmp.path() + "/deepspeed/launch.sh";
      const QString back = tmp.path() + "/" + target + ".json";
      args << "--device"
           << "h100-sxm-80gb"
           << "--out" << back;
      const Result im = engine(args);
      QVERIFY2(im.code == 0, qPrintable(target + ": " + im.err));
      QVERIFY2(im.err.contains("assumed: the device type") || target == "deepspeed", qPrintable(im.err));
      const Result p = engine({"plan", back});
      QVERIFY2(p.code == 0, qPrintable(p.err));
      QCOMPARE(stepLine(p.out), step);  // the same step time, tokens/s, MFU and fit
    }
    // What the target cannot say is on stderr; --strict refuses and writes nothing.
    const QString gpt = MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json";
    const Result titan = engine({"export", gpt, "--out", tmp.path() + "/gpt", "--target", "torchtitan"});
    QCOMPARE(titan.code, 2);
    QVERIFY2(titan.err.contains("/model/type: torchtitan trains Llama-family models"), qPrintable(titan.err));
    const Result strict =
        engine({"export", config, "--out", tmp.path() + "/strict", "--target", "megatron", "--strict"});
    QCOMPARE(strict.code, 2);
    QVERIFY2(strict.err.contains("not carried to Megatron-LM: evaluation over the whole split"),
             qPrintable(strict.err));
    QVERIFY(!QFileInfo::exists(tmp.path() + "/strict/megatron/pretrain_gpt.sh"));
    const Result badTarget = engine({"export", config, "--out", tmp.path(), "--target", "jax"});
    QCOMPARE(badTarget.code, 2);
    QVERIFY(badTarget.err.contains("--target: 'jax' is not one of"));
    // Import of the golden GPT-3 script: unknown flags listed, the plan valid.
    const Result golden = engine({"import", MS_SOURCE_DIR "/tests/data/frameworks/megatron_gpt3_175b.sh",
                                  "--device", "a100-80gb", "--out", tmp.path() + "/gpt3.json"});
    QVERIFY2(golden.code == 0, qPrintable(golden.err));
    QVERIFY2(golden.err.contains("unknown to Megatron-LM: --not-a-megatron-flag 3"), qPrintable(golden.err));
    QVERIFY(golden.err.contains("not carried: --overlap-grad-reduce"));
    const Result missing = engine({"import", tmp.path() + "/nothing.sh"});
    QCOMPARE(missing.code, 2);
    QVERIFY(missing.err.contains("nothing.sh: cannot read the file"));
    const QString bad = tmp.path() + "/bad.toml";
    std::ofstream(bad.toStdString()) << "[model]\nflavor = \"8B\"\nflavor = \"70B\"\n";
    const Result dup = engine({"import", bad});
    QCOMPARE(dup.code, 2);
    QVERIFY2(dup.err.contains("bad.toml: line 3: the key 'flavor' is defined twice"), qPrintable(dup.err));
  }

  void autoplanCommand() {
    QTemporaryDir tmp;
    const QString best = tmp.path() + "/best.json";
    const Result r = engine({"autoplan", MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json", "--top",
                             "3", "--json", "--write", best});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonArray plans = QJsonDocument::fromJson(r.out.toUtf8()).object()["plans"].toArray();
    QCOMPARE(plans.size(), 3);
    double previous = 0;
    QSet<QString> seen;  // every row is a different plan: the fields the search varies tell them apart
    for (const auto& p : plans) {
      const QJsonObject o = p.toObject();
      QVERIFY(QStringList({"none", "optimizer", "parameters"}).contains(o["offload"].toString()));
      QJsonObject key = o;
      for (const char* metric : {"step_time_s", "tokens_per_s", "mfu", "mfu_defined", "bubble_fraction",
                                 "peak_memory_bytes", "capacity_bytes"})
        key.remove(metric);
      const QString k = QString::fromUtf8(QJsonDocument(key).toJson(QJsonDocument::Compact));
      QVERIFY2(!seen.contains(k), qPrintable("two rows of the same plan: " + k));
      seen.insert(k);
      QCOMPARE(o["dp"].toInt() * o["tp"].toInt() * o["pp"].toInt(), 1024);
      QVERIFY(o["step_time_s"].toDouble() >= previous);
      previous = o["step_time_s"].toDouble();
      QVERIFY(o["peak_memory_bytes"].toDouble() <= o["capacity_bytes"].toDouble());
    }
    const Result v = engine({"validate", best});
    QVERIFY2(v.code == 0, qPrintable(v.err));
    const Result bad =
        engine({"autoplan", MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json", "--top", "0"});
    QCOMPARE(bad.code, 2);
  }

  // launch --dry-run prints the mpirun line for the plan: one rank per planned device, a hostfile from the
  // mesh when it has several nodes, the train arguments after "--".
  void launchDryRun() {
    const Result one = engine({"launch", MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json", "--dry-run"});
    QVERIFY2(one.code == 0, qPrintable(one.err));
    QVERIFY2(one.out.startsWith("mpirun -np 1 "), qPrintable(one.out));
    QVERIFY(one.out.contains("meshstudio-engine train ") && one.out.contains("gpt-fortunes.json"));
    QVERIFY(!one.out.contains("--hostfile"));
    const Result big = engine({"launch", MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json", "--dry-run",
                               "--", "--quiet", "--steps", "10"});
    QVERIFY2(big.code == 0, qPrintable(big.err));
    QVERIFY(big.out.contains("node000 slots=8\n"));
    QVERIFY(big.out.contains("node127 slots=8\n"));
    QVERIFY(big.out.contains("mpirun -np 1024 --hostfile runs/gpt3-175b/hostfile"));
    QVERIFY(big.out.trimmed().endsWith("--quiet --steps 10"));
    const Result bad = engine({"launch", MS_TEST_DATA_DIR "/broken/tp_not_dividing_heads.json", "--dry-run"});
    QCOMPARE(bad.code, 2);
  }

  // export writes the plan as files for a headless run: the config (data paths made absolute), a hostfile
  // for several nodes, launch.sh (mpirun) and slurm.sbatch; the launch script really runs the plan.
  void exportCommand() {
    QTemporaryDir dir;
    const QString out = dir.path() + "/gpt3";
    const Result big =
        engine({"export", MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json", "--out", out});
    QVERIFY2(big.code == 0, qPrintable(big.err));
    QFile hostfile(out + "/hostfile");
    QVERIFY(hostfile.open(QIODevice::ReadOnly));
    const QStringList hosts = QString::fromUtf8(hostfile.readAll()).split('\n', Qt::SkipEmptyParts);
    QCOMPARE(hosts.size(), 128);
    QCOMPARE(hosts.front(), QString("node000 slots=8"));
    QFile launch(out + "/launch.sh"), slurm(out + "/slurm.sbatch");
    QVERIFY(launch.open(QIODevice::ReadOnly) && slurm.open(QIODevice::ReadOnly));
    const QString launchText = QString::fromUtf8(launch.readAll()),
                  slurmText = QString::fromUtf8(slurm.readAll());
    QVERIFY2(launchText.contains("exec mpirun -np 1024 "), qPrintable(launchText));
    QVERIFY(launchText.contains("--hostfile \"$here/hostfile\" --map-by slot"));
    QVERIFY2(slurmText.contains("#SBATCH --nodes=128\n") &&
                 slurmText.contains("#SBATCH --ntasks-per-node=8\n") &&
                 slurmText.contains("#SBATCH --gpus-per-node=8\n") && slurmText.contains("mpirun -np 1024 "),
             qPrintable(slurmText));
    QVERIFY(QFileInfo(out + "/launch.sh").isExecutable());
    for (const QString& script : {out + "/launch.sh", out + "/slurm.sbatch"}) {
      QProcess bash;
      bash.start("bash", {"-n", script});
      QVERIFY(bash.waitForFinished(10000));
      QVERIFY2(bash.exitCode() == 0, qPrintable(script + ": " + bash.readAllStandardError()));
    }
    // The exported config is the example's plan, its relative data globs now absolute.
    const Result valid = engine({"validate", out + "/config.json"});
    QVERIFY2(valid.code == 0, qPrintable(valid.err));
    QFile exported(out + "/config.json");
    QVERIFY(exported.open(QIODevice::ReadOnly));
    const QJsonObject doc = QJsonDocument::fromJson(exported.readAll()).object();
    QCOMPARE(doc["parallel"].toObject()["pp"].toInt(), 8);
    QCOMPARE(doc["data"].toObject()["train"].toArray()[0].toString(),
             QString(MS_SOURCE_DIR "/resources/examples/data/gpt3/train_*.bin"));

    // A one-node plan: no hostfile; launch.sh runs it here through mpirun.
    const QString text = dir.path() + "/text.txt";
    std::ofstream(text.toStdString())
        << QString("the quick brown fox jumps over the lazy dog. ").repeated(60).toStdString();
    const QString tiny = tinyGpt(dir.path(), text);
    const Result small = engine({"export", tiny, "--out", dir.path() + "/tiny"});
    QVERIFY2(small.code == 0, qPrintable(small.err));
    QVERIFY(!QFile::exists(dir.path() + "/tiny/hostfile"));
    QProcess run;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("MESHSTUDIO_ENGINE", kEngine);
    run.setProcessEnvironment(env);
    run.start(dir.path() + "/tiny/launch.sh", {"--steps", "2", "--quiet"});
    QVERIFY(run.waitForFinished(120000));
    QVERIFY2(run.exitCode() == 0, qPrintable(run.readAllStandardError()));
    QVERIFY(QFileInfo::exists(dir.path() + "/tiny/runs/tiny/checkpoints/step-00000002"));

    QCOMPARE(engine({"export", tiny}).code, 2);  // no --out
    const Result unwritable = engine({"export", tiny, "--out", "/proc/meshstudio-export"});
    QCOMPARE(unwritable.code, 1);
    QVERIFY2(unwritable.err.contains("/proc/meshstudio-export"), qPrintable(unwritable.err));
  }

  void schemaPrints() {
    const Result r = engine({"schema"});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("\"$schema\""));
    QFile committed(MS_SOURCE_DIR "/resources/run-config.schema.json");
    QVERIFY(committed.open(QIODevice::ReadOnly));
    QCOMPARE(r.out.trimmed(), QString::fromUtf8(committed.readAll()).trimmed());
  }
};

QTEST_APPLESS_MAIN(TestCli)
#include "tst_cli.moc"
