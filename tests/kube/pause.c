/* The lab's pod sandbox process (tests/kube/images.py builds it with gcc -static into
 * localhost/lens-lab/pause:1). As PID 1 of a pod it holds the pod's namespaces open:
 * it sleeps until SIGINT or SIGTERM, then exits 0, and reaps any process re-parented to
 * it meanwhile so none stays a zombie. `pause -v` prints its name and exits. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
	static const char said[] = "pause: stopping\n";
	(void)sig;
	(void)!write(STDERR_FILENO, said, sizeof(said) - 1);
	_exit(0);
}

static void on_child(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

static int handle(int sig, void (*fn)(int), int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("lens-lab pause 1");
		return 0;
	}
	if (getpid() != 1)
		fputs("pause: not PID 1; orphans go to another reaper\n", stderr);
	if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
	    handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART)) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;)
		pause();
}
