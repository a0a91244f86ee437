/*
 * ioflusher: runs a command the way gzramd runs itself to serve swap: as
 * the kernel's IO flusher (PR_SET_IO_FLUSHER: its allocations never wait
 * for I/O, swap writes included), real-time (SCHED_RR 1: it may allocate
 * below the min watermark) and out of the OOM killer's reach
 * (oom_score_adj -1000). All three pass to the processes it forks and
 * survive execve: host-tls runs nbd-client under it, so that the TLS proxy
 * nbd-client forks, which carries the kernel's swap, has them too
 * (test/e2e/README.md). Memory locks do not pass to a child, so the proxy's
 * pages are kept out of swap by a cgroup instead (init.sh).
 *
 * Usage: ioflusher COMMAND [ARG...]   Built with gcc -static.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

int main(int argc, char **argv)
{
	struct sched_param sp = { .sched_priority = 1 };
	FILE *f;

	if (argc < 2) {
		fprintf(stderr, "usage: ioflusher COMMAND [ARG...]\n");
		return 2;
	}
	if (prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) != 0) {
		fprintf(stderr, "ioflusher: PR_SET_IO_FLUSHER: %s\n", strerror(errno));
		return 1;
	}
	if (sched_setscheduler(0, SCHED_RR, &sp) != 0) {
		fprintf(stderr, "ioflusher: SCHED_RR: %s\n", strerror(errno));
		return 1;
	}
	f = fopen("/proc/self/oom_score_adj", "w");
	if (!f || fputs("-1000", f) < 0 || fclose(f) != 0) {
		fprintf(stderr, "ioflusher: oom_score_adj: %s\n", strerror(errno));
		return 1;
	}
	execvp(argv[1], argv + 1);
	fprintf(stderr, "ioflusher: %s: %s\n", argv[1], strerror(errno));
	return 127;
}
