#!/usr/bin/env python3
"""Checks the console of a `survive` guest (test/e2e/README.md) from the host.

Usage: survive.py CONSOLE MIN_KILLS EARLY_EVERY [MIN_UPGRADES]

The guest judged the hog, the kernel's log and the metrics; this reads what
only the console shows: gzramd's own log lines, interleaved with the
killer's (E2E-KILL) and the hog's. It checks that
  - the guest's kill count matches its E2E-KILL lines, and is >= MIN_KILLS;
  - a serving process logged "took the device over from a serving process
    that died" once per kill (each kill was followed by a takeover);
  - at least one kill hit a serving process during its takeover: between
    the supervisor's "serving process started pid=X" and the kill of X,
    X logged neither "gzramd ready" nor "serving again after the takeover"
    (required when EARLY_EVERY > 0 and MIN_KILLS >= EARLY_EVERY);
  - kills fell in the hog's write phase and in its verify phase (before and
    after "hog: wrote M of M MiB"; required when MIN_KILLS >= 2);
  - at least MIN_UPGRADES planned upgrades (E2E-UPGRADE lines), each taken
    over as an upgrade ("which handed it over") and with no kernel nbd log
    line between the signal and 1 s after the next process took over: the
    kernel saw no disconnect.
It prints one E2E-SURVIVE-SUMMARY line (kills, takeovers, pauses) and exits
1 naming every check that failed.
"""
import re
import statistics
import sys

DUR = re.compile(r'(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)')
SCALE = {'h': 3600, 'm': 60, 's': 1, 'ms': 1e-3, 'us': 1e-6, 'µs': 1e-6, 'ns': 1e-9}


def seconds(go_duration):
    """A Go time.Duration's String() in seconds."""
    return sum(float(v) * SCALE[u] for v, u in DUR.findall(go_duration))


def main():
    console, min_kills, early = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    min_upgrades = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    with open(console, 'rb') as f:
        lines = f.read().decode('utf-8', 'replace').replace('\r', '').split('\n')

    kills = []  # (n, pid, what, phase, served_before_kill)
    served = {}  # pid -> logged ready/serving again
    current = None
    phase = 'before-hog'
    took_over = 0
    upgrades = []  # (n, took seconds, kernel nbd lines)
    handed = 0
    pauses = []
    guest_kills = None
    started = 0
    for line in lines:
        m = re.search(r'msg="serving process started" .*\bpid=(\d+)', line)
        if m:
            current = m.group(1)
            served[current] = False
            started += 1
            continue
        if 'msg="took the device over from a serving process that died"' in line:
            took_over += 1
        if 'which handed it over (an upgrade)' in line:
            handed += 1
        m = re.match(r'E2E-UPGRADE (\d+) .*took=(\S+)s(?: kernel_nbd_lines=(-?\d+))?', line)
        if m:
            upgrades.append((int(m.group(1)), float(m.group(2)), None if m.group(3) is None else int(m.group(3))))
        if 'msg="gzramd ready"' in line and current:
            served[current] = True
        if 'msg="serving again after the takeover"' in line:
            if current:
                served[current] = True
            m = re.search(r'\bpause=(\S+)', line)
            if m:
                pauses.append(seconds(m.group(1)))
        if line.startswith('E2E-STEP: survive:'):
            phase = 'write'
        m = re.match(r'hog: wrote (\d+) of (\d+) MiB', line)
        if m and m.group(1) == m.group(2):
            phase = 'verify'
        m = re.match(r'E2E-KILL (\d+) pid=(\d+) .*\((.*)\)$', line)
        if m:
            pid = m.group(2)
            kills.append((int(m.group(1)), pid, m.group(3), phase, served.get(pid)))
        m = re.match(r'E2E-SURVIVE kills=(\d+)', line)
        if m:
            guest_kills = int(m.group(1))

    bad = []
    n = len(kills)
    if guest_kills is None:
        bad.append('no E2E-SURVIVE kills= line: the guest did not get to the end')
    elif guest_kills != n:
        bad.append(f'the guest counted {guest_kills} kills, the console shows {n} E2E-KILL lines')
    if n < min_kills:
        bad.append(f'{n} kills, want at least {min_kills}')
    if took_over != n:
        bad.append(f'{took_over} "took the device over" lines for {n} kills')
    in_takeover = [k for k in kills if k[4] is False]
    unknown = [k for k in kills if k[4] is None]
    if unknown:
        bad.append(f'kills of pids the supervisor never reported starting: {[k[1] for k in unknown]}')
    if early > 0 and min_kills >= early and not in_takeover:
        bad.append('no kill hit a serving process during its takeover (before it logged ready/serving again)')
    phases = {p: sum(1 for k in kills if k[3] == p) for p in ('write', 'verify')}
    if min_kills >= 2 and (phases['write'] == 0 or phases['verify'] == 0):
        bad.append(f'kills by the hog\'s phase: {phases}; want some in each')

    if len(upgrades) < min_upgrades:
        bad.append(f'{len(upgrades)} planned upgrades, want at least {min_upgrades}')
    if handed != len(upgrades):
        bad.append(f'{handed} "handed it over (an upgrade)" lines for {len(upgrades)} upgrades')
    noisy = [u for u in upgrades if u[2] != 0]
    if noisy:
        bad.append(f'upgrades the kernel noticed (nbd log lines, or no next process): {noisy}')
    pause = 'none'
    if pauses:
        pause = (f'{len(pauses)} served again, pause min {min(pauses):.1f} s, median '
                 f'{statistics.median(pauses):.1f} s, max {max(pauses):.1f} s')
    print(f'E2E-SURVIVE-SUMMARY kills={n} (write {phases["write"]}, verify {phases["verify"]}, '
          f'in takeover {len(in_takeover)}: {[k[0] for k in in_takeover]}) '
          f'serving processes started={started} took-over lines={took_over}; {pause}; '
          f'upgrades={len(upgrades)} took {[u[1] for u in upgrades]} s')
    for b in bad:
        print(f'survive check FAILED: {b}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
