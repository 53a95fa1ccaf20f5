// Running a program from a test, bounded: its exit code, whether it finished, and what it wrote. Shared by
// the suites that start the engine as a real process (mpi_test_util.h adds mpirun and checkpoints on top).
#pragma once

#include <QProcess>
#include <QString>
#include <QStringList>

namespace ms::test {

struct ProcessResult {
  int code = -1;          // -1 when it crashed or did not finish
  bool finished = false;  // false: killed after timeoutMs (its mpirun jobs die with it, PR_SET_PDEATHSIG)
  QString out, err;
};

// Runs program with args, waiting at most timeoutMs. Open MPI is allowed to run as root and to oversubscribe
// (a test's ranks may outnumber this machine's cores).
inline ProcessResult runProcess(const QString& program, const QStringList& args, int timeoutMs = 300000) {
  QProcess p;
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("OMPI_ALLOW_RUN_AS_ROOT", "1");
  env.insert("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  env.insert("OMPI_MCA_rmaps_base_oversubscribe", "1");
  p.setProcessEnvironment(env);
  p.start(program, args);
  ProcessResult r;
  r.finished = p.waitForFinished(timeoutMs);
  if (!r.finished) {
    p.kill();
    p.waitForFinished(5000);
    r.err = "timed out";
    return r;
  }
  r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  r.out = QString::fromUtf8(p.readAllStandardOutput());
  r.err = QString::fromUtf8(p.readAllStandardError());
  return r;
}

}  // namespace ms::test
