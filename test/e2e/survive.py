#!/usr/bin/env python3
"""Checks the console of a `survive` guest (test/e2e/README.md) from the host.

Usage: survive.py CONSOLE MIN_KILLS EARLY_EVERY [MIN_UPGRADES]

The guest judged the hog, the kernel's log and the metrics; this reads what
only the console shows: gzramd's own log lines, interleaved with the
killer's (E2E-KILL) and the hog's. It checks that
  - the guest's kill count matches its E2E-KILL lines, and is >= MIN_KILLS;
  - a serving process logged "took the device over from a serving process
    that died" once per kill (each kill was followed by a takeover), and
    gzramd_takeovers_total (E2E-SURVIVE takeovers_total=, scraped by the
    guest at the end) is the kills plus the upgrades; no takeover line
    says a page was LOST;
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
A kill can land on the process that was to take over before it logged its
takeover line: an upgrade's successor (the upgrade is then never taken
over as one) or a kill's successor (the next process takes over once for
both kills). The state counts a takeover only once it is done, so each such
kill leaves one "took the device over"/"handed it over" line and (unless it
fell in the instant between the state's count and the log line) one
takeover fewer. Those are recognised, reported ("upgrade 3 interrupted by
kill 21 before it took over") and allowed for, but only while nothing was
lost: the hog verified everything (HOG-PASS), gzramd_lost_pages is 0, no
takeover found a LOST page and the kernel logged no I/O error
(E2E-SURVIVE io_error_lines=0). Otherwise the counts must be exact.
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
    taken = []  # per upgrade: until the next process took over (killer.c), 'none', '?' (an older killer)
    handed = 0
    pauses = []
    guest_kills = None
    started = 0
    # Takeovers under way: the kill whose successor has not logged "took
    # the device over" yet, and the upgrade whose successor has not logged
    # "handed it over" yet.
    pending_kill = None
    pending_upgrade = None
    interrupted = []  # (upgrade n, kill n): its successor killed before it took over
    merged = []  # (kill n, earlier kill n): likewise, a kill's successor
    lost_lines = []
    end = {}  # E2E-SURVIVE key=value at the end
    hog_pass = False
    for line in lines:
        m = re.search(r'msg="serving process started" .*\bpid=(\d+)', line)
        if m:
            current = m.group(1)
            served[current] = False
            started += 1
            continue
        if 'msg="took the device over from a serving process that died"' in line:
            took_over += 1
            pending_kill = None
        if 'which handed it over (an upgrade)' in line:
            handed += 1
            pending_upgrade = None
        if 'msg="took the device over' in line and ' LOST ' in line:
            lost_lines.append(line.strip())
        if line.startswith('HOG-PASS'):
            hog_pass = True
        m = re.match(r'E2E-UPGRADE (\d+) .*took=(\S+)s(?: kernel_nbd_lines=(-?\d+))?', line)
        if m:
            upgrades.append((int(m.group(1)), float(m.group(2)), None if m.group(3) is None else int(m.group(3))))
            t = re.search(r' taken_over=(\S+)', line)
            taken.append(t.group(1) if t else '?')
            # The killer prints it 1 s after the successor appeared: its
            # "handed it over" may already be above.
            if handed < len(upgrades):
                pending_upgrade = int(m.group(1))
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
            if pending_upgrade is not None:
                interrupted.append((pending_upgrade, int(m.group(1))))
                pending_upgrade = None
            elif pending_kill is not None:
                merged.append((int(m.group(1)), pending_kill))
            pending_kill = int(m.group(1))
        m = re.match(r'E2E-SURVIVE kills=(\d+)', line)
        if m:
            guest_kills = int(m.group(1))
        if line.startswith('E2E-SURVIVE '):
            end.update(re.findall(r'(\w+)=(\S+)', line))

    bad = []
    n = len(kills)
    if guest_kills is None:
        bad.append('no E2E-SURVIVE kills= line: the guest did not get to the end')
    elif guest_kills != n:
        bad.append(f'the guest counted {guest_kills} kills, the console shows {n} E2E-KILL lines')
    if n < min_kills:
        bad.append(f'{n} kills, want at least {min_kills}')
    # What a kill that interrupted a takeover may excuse: only while no
    # page was lost and the kernel saw no I/O error.
    def number(key):
        try:
            return float(end[key])
        except (KeyError, ValueError):
            return None
    lost_pages, io_lines, takeovers = number('lost_pages'), number('io_error_lines'), number('takeovers_total')
    clean = hog_pass and lost_pages == 0 and io_lines == 0 and not lost_lines
    why_not = ', '.join(w for w, b in (('the hog did not pass', not hog_pass),
                                       (f'gzramd_lost_pages={end.get("lost_pages", "none")}', lost_pages != 0),
                                       (f'{end.get("io_error_lines", "unknown")} kernel I/O error lines', io_lines != 0),
                                       (f'{len(lost_lines)} takeovers found LOST pages', bool(lost_lines))) if b)
    notes = ([f'upgrade {u} interrupted by kill {k} before it took over' for u, k in interrupted] +
             [f'kill {k} landed on the successor of kill {j} before it took over' for k, j in merged])
    excused_i, excused_m = (len(interrupted), len(merged)) if clean else (0, 0)
    if notes and not clean:
        bad.append(f'not allowed for ({why_not}): {"; ".join(notes)}')
    if lost_lines:
        bad.append(f'a takeover lost pages: {lost_lines[0]}')
    if took_over != n - excused_m:
        bad.append(f'{took_over} "took the device over" lines for {n} kills'
                   + (f' ({excused_m} of them on a successor that had not taken over)' if excused_m else ''))
    want_hi = n + len(upgrades)
    want_lo = want_hi - excused_i - excused_m
    if takeovers is None:
        bad.append(f'no gzramd_takeovers_total at the end (E2E-SURVIVE takeovers_total={end.get("takeovers_total", "missing")})')
    elif not want_lo <= takeovers <= want_hi:
        want = f'{want_hi}' if want_lo == want_hi else f'{want_lo}..{want_hi}'
        bad.append(f'gzramd_takeovers_total={takeovers:.0f} but {n} kills and {len(upgrades)} upgrades'
                   f' (want {want}{"; " + "; ".join(notes) if notes and clean else ""})')
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
    if handed != len(upgrades) - excused_i:
        bad.append(f'{handed} "handed it over (an upgrade)" lines for {len(upgrades)} upgrades'
                   + (f' ({excused_i} interrupted)' if excused_i else ''))
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
          f'upgrades={len(upgrades)} took {[u[1] for u in upgrades]} s, taken over after {taken}; '
          f'takeovers_total={end.get("takeovers_total", "none")} lost_pages={end.get("lost_pages", "none")} '
          f'io_error_lines={end.get("io_error_lines", "none")}'
          + (f'; interrupted takeovers: {"; ".join(notes)}' if notes else ''))
    for b in bad:
        print(f'survive check FAILED: {b}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
