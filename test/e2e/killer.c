/*
 * killer: the `survive` scenario's killer (test/e2e/README.md). SIGKILLs
 * the serving process of a gzramd supervisor (its child, never the
 * supervisor itself) again and again while the hog runs.
 *
 * Usage: killer SUPERVISOR_PID MAX_KILLS KMIN KMAX EARLY EARLYMAX STOPFILE COUNTFILE
 *               [UPGRADE_EVERY QUIET UPGRADEFILE]
 * Each serving process is killed KMIN..KMAX seconds (uniformly random, to
 * the millisecond) after it appeared; every EARLY-th kill (0: none) is
 * made during the takeover instead: 0..EARLYMAX seconds after the process
 * took the state over (its gzramd-heaplock thread runs: pipeline.Open is
 * done, the kernel device not yet taken over). Stops after MAX_KILLS, when
 * STOPFILE exists (the hog ended) or when the supervisor is gone; writes
 * the number of kills to COUNTFILE after each. With KILLER_WROTE_FILE set,
 * at most half of MAX_KILLS are made before that file exists (the hog made
 * it when its write phase ended: HOG_WROTE_FILE), so that kills fall in
 * the verify phase too however long writing takes: a slow write phase
 * once took all 10 of survive-fast's. Prints one line per kill:
 *   E2E-KILL N pid=PID after=SECONDSs uptime=UPTIME (serving|takeover)
 * and one per upgrade (took: until the next process appeared; taken_over:
 * until it took over, its gzramd-heaplock thread running, or none):
 *   E2E-UPGRADE N old=PID new=PID took=S kernel_nbd_lines=K taken_over=S
 *
 * A shell loop did this first, and saw a new process take the state over
 * 6 s late: while the device waits for a server the shell's swapped-out
 * pages cannot come back, and gzramd's start-up runs real-time. So this is
 * locked in memory and real-time itself (SCHED_RR 2, above gzramd's 1),
 * and polls /proc every 5 ms without forking. Built with gcc -static.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char *stopfile;
static int supervisor;

static int stopped(void)
{
	return access(stopfile, F_OK) == 0 || kill(supervisor, 0) != 0;
}

static void nap(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* sleep_unless_stopped sleeps s seconds in 5 ms steps; 1 if told to stop. */
static int sleep_unless_stopped(double s)
{
	while (s > 0) {
		if (stopped())
			return 1;
		double d = s < 0.005 ? s : 0.005;
		nap(d);
		s -= d;
	}
	return stopped();
}

static double uniform(double a, double b)
{
	uint16_t r = 0;
	int fd = open("/dev/urandom", O_RDONLY);
	if (fd >= 0) {
		if (read(fd, &r, sizeof r) != sizeof r)
			r = (uint16_t)rand();
		close(fd);
	}
	return a + (b - a) * r / 65535.0;
}

static int read_line(const char *path, char *buf, size_t n)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t got = read(fd, buf, n - 1);
	close(fd);
	if (got < 0)
		return -1;
	buf[got] = 0;
	return 0;
}

/* child_not returns a child of ppid not among the nskip pids of skip, or 0. */
static int child_not(int ppid, const int *skip, int nskip)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	char path[64], buf[512];
	int found = 0;
	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		int pid = atoi(e->d_name), skipped = 0;
		for (int i = 0; i < nskip; i++)
			skipped |= pid == skip[i];
		if (pid <= 0 || skipped)
			continue;
		snprintf(path, sizeof path, "/proc/%d/stat", pid);
		if (read_line(path, buf, sizeof buf) != 0)
			continue;
		char *p = strrchr(buf, ')'); /* after "pid (comm)" */
		char state;
		int parent;
		if (p && sscanf(p + 1, " %c %d", &state, &parent) == 2 && parent == ppid && state != 'Z')
			found = pid;
	}
	closedir(d);
	return found;
}

/* child_of returns a child of ppid other than skip, or 0. */
static int child_of(int ppid, int skip)
{
	return child_not(ppid, &skip, 1);
}

/* has_thread reports whether pid has a thread named name. */
static int has_thread(int pid, const char *name)
{
	char path[320], buf[64];
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	struct dirent *e;
	int found = 0;
	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%s/comm", pid, e->d_name);
		if (read_line(path, buf, sizeof buf) == 0) {
			buf[strcspn(buf, "\n")] = 0;
			found = strcmp(buf, name) == 0;
		}
	}
	closedir(d);
	return found;
}

/* nbd_lines counts the kernel log's records that mention nbd. */
static int nbd_lines(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
	char rec[8192];
	int n = 0;
	if (fd < 0)
		return -1;
	for (;;) {
		ssize_t got = read(fd, rec, sizeof rec - 1);
		if (got < 0) {
			if (errno == EPIPE) /* overwritten while read: go on */
				continue;
			break; /* EAGAIN: the end */
		}
		rec[got] = 0;
		char *text = strchr(rec, ';');
		if (text && strstr(text, "nbd"))
			n++;
	}
	close(fd);
	return n;
}

static long vmstat(const char *name)
{
	char buf[16384], *p;
	size_t len = strlen(name);
	if (read_line("/proc/vmstat", buf, sizeof buf) != 0)
		return -1;
	for (p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
		if (strncmp(p, name, len) == 0 && p[len] == ' ')
			return atol(p + len + 1);
	return -1;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int alive(int pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	if (read_line(path, buf, sizeof buf) != 0)
		return 0;
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z';
}

/*
 * upgrade asks the supervisor to replace the serving process c, whose
 * start the killer saw at seen; it returns the next serving process, or
 * 0 when told to stop first.
 */
static int upgrade(int n, int c, double seen, int first, double quiet)
{
	if (first) {
		while (vmstat("pswpout") <= 0)
			if (sleep_unless_stopped(0.1))
				return 0;
	} else if (sleep_unless_stopped(seen + quiet - now())) {
		return 0;
	}
	/* The next serving process is a child started after the signal: the
	 * standby there now is of the old executable, and is discarded. */
	int old[8] = {c}, nold = 1;
	while (nold < 8 && (old[nold] = child_not(supervisor, old, nold)))
		nold++;
	int before = nbd_lines();
	double t0 = now();
	kill(supervisor, SIGHUP);
	int next = 0;
	while (alive(c) || !(next = child_not(supervisor, old, nold))) {
		if (kill(supervisor, 0) != 0)
			return 0;
		if (now() - t0 > 60) {
			printf("E2E-UPGRADE %d old=%d new=none took=60s (no next serving process)\n", n, c);
			return 0;
		}
		nap(0.005);
	}
	double took = now() - t0;
	/* The kernel's records are counted until 1 s after the next process
	 * took over, not merely appeared: its gzramd-heaplock thread starts
	 * once it holds the state and the kernel's connections. Counting from
	 * its appearance closed the window before a slow (TCG) takeover was
	 * done, and the kill that followed at once landed on a process that
	 * had not taken over yet (issue 26). */
	char taken[32] = "none";
	for (;;) {
		if (has_thread(next, "gzramd-heaplock")) {
			snprintf(taken, sizeof taken, "%.3fs", now() - t0);
			break;
		}
		if (!alive(next) || kill(supervisor, 0) != 0 || now() - t0 > 60)
			break;
		nap(0.005);
	}
	nap(1);
	printf("E2E-UPGRADE %d old=%d new=%d took=%.3fs kernel_nbd_lines=%d taken_over=%s\n", n, c, next, took,
	       nbd_lines() - before, taken);
	return next;
}

int main(int argc, char **argv)
{
	if (argc != 9 && argc != 12) {
		fprintf(stderr, "usage: killer SUPERVISOR_PID MAX_KILLS KMIN KMAX EARLY EARLYMAX STOPFILE COUNTFILE [UPGRADE_EVERY QUIET UPGRADEFILE]\n");
		return 2;
	}
	int upgrade_every = argc == 12 ? atoi(argv[9]) : 0, upgrades = 0;
	double quiet = argc == 12 ? atof(argv[10]) : 0;
	const char *upgradefile = argc == 12 ? argv[11] : NULL;
	supervisor = atoi(argv[1]);
	int max = atoi(argv[2]), early = atoi(argv[5]);
	double kmin = atof(argv[3]), kmax = atof(argv[4]), earlymax = atof(argv[6]);
	stopfile = argv[7];
	const char *countfile = argv[8];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0)
		perror("killer: mlockall");
	struct sched_param sp = {.sched_priority = 2};
	if (sched_setscheduler(0, SCHED_RR, &sp) != 0)
		perror("killer: SCHED_RR");
	const char *wrote = getenv("KILLER_WROTE_FILE");
	int n = 0, prev = 0;
	while (n < max) {
		if (wrote && *wrote && n >= max / 2) {
			while (access(wrote, F_OK) != 0) {
				if (stopped())
					return 0;
				nap(0.05);
			}
		}
		int c;
		while (!(c = child_of(supervisor, prev))) {
			if (stopped())
				return 0;
			nap(0.005);
		}
		double seen = now();
		if (upgrade_every > 0 && n % upgrade_every == 0 && upgrades == n / upgrade_every) {
			if (!(c = upgrade(upgrades + 1, c, seen, upgrades == 0, quiet)))
				return 0;
			upgrades++;
			FILE *f = fopen(upgradefile, "w");
			if (f) {
				fprintf(f, "%d\n", upgrades);
				fclose(f);
			}
		}
		int is_early = early > 0 && (n + 1) % early == 0;
		const char *what = "serving";
		double d;
		if (is_early) {
			what = "takeover";
			for (int i = 0; !has_thread(c, "gzramd-heaplock"); i++) {
				if (stopped())
					return 0;
				if (kill(c, 0) != 0)
					break; /* died on its own: the supervisor says so */
				if (i > 12000) {
					what = "takeover (no gzramd-heaplock thread after 60 s)";
					break;
				}
				nap(0.005);
			}
			d = uniform(0, earlymax);
			if (sleep_unless_stopped(d))
				return 0;
		} else {
			/* Counted from when the killer saw the process it would have
			 * killed: an upgrade in between does not push the kills
			 * out of the hog's write phase. */
			d = uniform(kmin, kmax);
			if (sleep_unless_stopped(seen + d - now()))
				return 0;
		}
		if (kill(c, SIGKILL) != 0) {
			printf("E2E-KILLER: pid %d is gone before kill %d\n", c, n + 1);
			prev = c;
			continue;
		}
		n++;
		char up[64] = "?";
		read_line("/proc/uptime", up, sizeof up);
		up[strcspn(up, " ")] = 0;
		printf("E2E-KILL %d pid=%d after=%.3fs uptime=%s (%s)\n", n, c, d, up, what);
		FILE *f = fopen(countfile, "w");
		if (f) {
			fprintf(f, "%d\n", n);
			fclose(f);
		}
		prev = c;
	}
	return 0;
}
