package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// stream is go test -json's output for the tests given as
// name=result:message, where message is logged (or skipped with).
func stream(t *testing.T, pkg string, tests ...string) string {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, spec := range tests {
		name, rest, _ := strings.Cut(spec, "=")
		result, msg, _ := strings.Cut(rest, ":")
		out := func(s string) { enc.Encode(event{Action: "output", Package: pkg, Test: name, Output: s}) }
		enc.Encode(event{Action: "run", Package: pkg, Test: name})
		out("=== RUN   " + name + "\n")
		if msg != "" {
			out("    x_test.go:12: " + msg + "\n")
		}
		out("--- " + strings.ToUpper(result) + ": " + name + " (0.00s)\n")
		enc.Encode(event{Action: result, Package: pkg, Test: name})
	}
	enc.Encode(event{Action: "output", Package: pkg, Output: "PASS\n"})
	enc.Encode(event{Action: "output", Package: pkg, Output: "ok  \t" + pkg + "\t0.1s\n"})
	return b.String()
}

func record1(t *testing.T, in string) (shown string, records []record) {
	t.Helper()
	var show, out bytes.Buffer
	if err := newRecorder(&show, &out).read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r record
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		records = append(records, r)
	}
	return show.String(), records
}

// run shows what go test without -v shows: the package's line, and the
// output of failing tests only.
func TestRunShowsWhatGoTestShows(t *testing.T) {
	in := stream(t, "example.com/p",
		"TestOK=pass:fine", "TestBad=fail:it broke", "TestAway=skip:"+testneeds.Message(testneeds.KindPackage, "fio", "fio not installed"))
	shown, records := record1(t, "not json\n"+in)
	for _, want := range []string{"not json\n", "it broke", "--- FAIL: TestBad", "ok  \texample.com/p\t0.1s\n"} {
		if !strings.Contains(shown, want) {
			t.Errorf("shown output lacks %q:\n%s", want, shown)
		}
	}
	for _, hide := range []string{"fine", "TestOK", "TestAway", "PASS\n"} {
		if strings.Contains(strings.ReplaceAll(shown, "ok  \t", ""), hide) {
			t.Errorf("shown output has %q, which go test without -v hides:\n%s", hide, shown)
		}
	}
	if len(records) != 3 || records[2].Result != "skip" || records[2].Skip != "needs package fio: fio not installed" {
		t.Errorf("records = %+v", records)
	}
}

// The summary counts a test as run if any run ran it (make test runs most
// twice), groups what did not by need, and says how to run it.
func TestSummaryAccountsForEverySkip(t *testing.T) {
	pkgMsg := testneeds.Message(testneeds.KindPackage, "libnbd-bin", "nbdcopy not installed (apt-get install libnbd-bin)")
	_, unit := record1(t, stream(t, "example.com/p",
		"TestA=pass:", "TestB=skip:"+pkgMsg, "TestC=skip:"+pkgMsg,
		"TestCorpus=skip:"+testneeds.Message(testneeds.KindCorpus, "", testneeds.CorpusMissing),
		"TestNBD=skip:"+testneeds.Message(testneeds.KindModule, "nbd", "no /dev/nbd0"),
		"TestLock=skip:"+testneeds.Message(testneeds.KindLimit, "memlock", "locks 64 MiB, over this user's RLIMIT_MEMLOCK of 8 MiB"),
		"TestSlow=skip:"+testneeds.Message(testneeds.KindOptIn, "GZRAMD_SLOW", "slow"),
		"TestChild=skip:"+testneeds.Message(testneeds.KindHelper, "", "the body of a process TestA starts"),
		"TestShort=pass:",
		"TestLint=pass:"+testneeds.PartPrefix+testneeds.Message(testneeds.KindPackage, "prometheus", "promtool not installed"),
		"TestOdd=skip:something else"))
	_, race := record1(t, stream(t, "example.com/p", "TestA=pass:", "TestShort=skip:short mode"))
	s := summarize(append(unit, race...))
	if s.ran != 3 || len(s.skipped) != 8 || len(s.parts) != 1 || s.packageSkips() != 2 {
		t.Fatalf("ran %d, skipped %d, parts %d, package skips %d: %+v", s.ran, len(s.skipped), len(s.parts), s.packageSkips(), s)
	}
	var b strings.Builder
	s.write(&b, true)
	out := b.String()
	for _, want := range []string{
		"3 tests ran, 0 failed; 7 did not run (and 1 ran inside other tests); 1 ran without one of their checks",
		"2 need Debian packages", "2 libnbd-bin: nbdcopy not installed", "p.TestB",
		"1 need the corpus", "1 need a kernel module", "1 are opt-in", "1 skipped for other reasons", "something else",
		"Ran without a check:", "prometheus: promtool not installed",
		"apt-get install libnbd-bin prometheus\n", "GZRAMD_CORPUS=FILE", "modprobe nbd", "GZRAMD_SLOW",
		"1 need a higher resource limit", "memlock: locks 64 MiB", "/etc/security/limits.d/", "make test as root",
		"\n3 passed, 0 failed, 7 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "short mode") {
		t.Errorf("a test skipped under -short but run in the other pass is in the summary:\n%s", out)
	}
}

// A check that some run made is not missing.
func TestSummaryPartMissingOnlyIfEveryRunLackedIt(t *testing.T) {
	part := "TestLint=pass:" + testneeds.PartPrefix + testneeds.Message(testneeds.KindPackage, "prometheus", "promtool")
	_, a := record1(t, stream(t, "p", part))
	_, b := record1(t, stream(t, "p", "TestLint=pass:"))
	if s := summarize(append(a, b...)); len(s.parts) != 0 {
		t.Errorf("parts = %+v, want none", s.parts)
	}
	if s := summarize(append(a, a...)); len(s.parts) != 1 {
		t.Errorf("parts = %+v, want one", s.parts)
	}
}

// A test that failed in any run is named in the summary, which still
// ends with its closing line; a run that left no records is named too.
func TestSummaryNamesFailures(t *testing.T) {
	_, unit := record1(t, stream(t, "example.com/p", "TestA=pass:", "TestBad=pass:"))
	_, race := record1(t, stream(t, "example.com/p", "TestA=pass:", "TestBad=fail:it broke"))
	s := summarize(append(unit, race...))
	s.absent = []string{"bin/test-runs/race-nbd-helpers.json"}
	var b strings.Builder
	s.write(&b, false)
	out := b.String()
	for _, want := range []string{
		"2 tests ran, 1 failed; 0 did not run", "Failed (their output is above):\n      p.TestBad\n",
		"No results in bin/test-runs/race-nbd-helpers.json", "\n1 passed, 1 failed, 0 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, "1 passed, 1 failed, 0 skipped\n") {
		t.Errorf("the summary does not end with its closing line:\n%s", out)
	}
}

// A test binary that dies in a test (a crash, a fatal error) ends with
// the package's fail and no end for the test: what the test wrote, the
// crash's trace, is shown then.
func TestRunShowsATestTheBinaryDiedIn(t *testing.T) {
	const pkg = "example.com/p"
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.Encode(event{Action: "run", Package: pkg, Test: "TestDies"})
	enc.Encode(event{Action: "output", Package: pkg, Test: "TestDies", Output: "=== RUN   TestDies\n"})
	enc.Encode(event{Action: "output", Package: pkg, Test: "TestDies", Output: "unexpected fault address 0x7f00\n"})
	enc.Encode(event{Action: "output", Package: pkg, Output: "FAIL\texample.com/p\t2.1s\n"})
	enc.Encode(event{Action: "fail", Package: pkg})
	shown, _ := record1(t, b.String())
	for _, want := range []string{"TestDies did not finish", "unexpected fault address 0x7f00", "FAIL\texample.com/p"} {
		if !strings.Contains(shown, want) {
			t.Errorf("shown output lacks %q:\n%s", want, shown)
		}
	}
}
