// A child process for tests that run real servers (etcd, a collector) and
// kill them: started with execv, stderr and stdout appended to a log file,
// killed with SIGKILL (as a crash) or stopped with SIGTERM.
#ifndef SONDE_TESTS_TESTING_CHILD_PROCESS_H_
#define SONDE_TESTS_TESTING_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace sonde::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv[0] with `argv`; false if it could not be forked.
  bool Start(std::vector<std::string> argv, const std::string& log) {
    Kill();
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    pid_ = pid;
    return true;
  }

  // Whether it is still running (reaps it if it has exited).
  bool Running() {
    if (pid_ <= 0) return false;
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
    return pid_ > 0;
  }

  pid_t pid() const { return pid_; }

  // SIGKILL, as a crash, and waits for it.
  void Kill() { Signal(SIGKILL); }
  // SIGTERM, and waits for it to exit.
  void Terminate() { Signal(SIGTERM); }

 private:
  void Signal(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  pid_t pid_ = -1;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_CHILD_PROCESS_H_
