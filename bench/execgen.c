/* execgen: /bin/true exec storm.  execgen SECONDS  ->  execs=N seconds=S rate=R */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

extern char **environ;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    char *args[] = {"/bin/true", 0};
    long n = 0;
    double start = now();
    while (now() - start < seconds) {
        pid_t pid;
        if (posix_spawn(&pid, "/bin/true", 0, 0, args, environ) == 0) {
            waitpid(pid, 0, 0);
            n++;
        }
    }
    double took = now() - start;
    printf("execs=%ld seconds=%.3f rate=%.0f pid=%d\n", n, took, n / took, (int)getpid());
    return 0;
}
