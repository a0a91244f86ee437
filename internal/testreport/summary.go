package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
)

// need is a parsed testneeds message.
type need struct{ kind, name, detail string }

// parseNeed reads "needs KIND [NAME]: DETAIL"; any other message is of
// kind "other", its detail the message.
func parseNeed(msg string) need {
	m := needRE.FindStringSubmatch(msg)
	if m == nil {
		return need{kind: "other", detail: msg}
	}
	return need{kind: m[1], name: m[2], detail: m[3]}
}

// missing is a test that did not run, or a check that did not, and why.
type missing struct {
	test string // package (last element) and test name
	need need
}

// summary is what the runs of make test did, merged: a test ran if it
// ran in any of them (make test runs most twice, once under -race
// -short).
type summary struct {
	ran     int
	failed  []string // tests that failed in any run
	skipped []missing
	parts   []missing
	absent  []string // record files not written: their go test did not run
}

func summarize(records []record) summary {
	type state struct {
		ran   bool
		fail  bool
		skip  string
		parts map[string]bool // nil until the test ran; then the parts every run of it lacked
	}
	tests := make(map[string]*state)
	for _, r := range records {
		key := path.Base(r.Package) + "." + r.Test
		st := tests[key]
		if st == nil {
			st = &state{}
			tests[key] = st
		}
		if r.Result == "skip" {
			if st.skip == "" {
				st.skip = r.Skip
			}
			continue
		}
		st.fail = st.fail || r.Result == "fail"
		parts := make(map[string]bool)
		for _, p := range r.Parts {
			if !st.ran || st.parts[p] {
				parts[p] = true
			}
		}
		st.ran, st.parts = true, parts
	}
	var s summary
	for _, key := range slices.Sorted(maps.Keys(tests)) {
		st := tests[key]
		if !st.ran {
			s.skipped = append(s.skipped, missing{key, parseNeed(st.skip)})
			continue
		}
		s.ran++
		if st.fail {
			s.failed = append(s.failed, key)
		}
		for _, p := range slices.Sorted(maps.Keys(st.parts)) {
			s.parts = append(s.parts, missing{key, parseNeed(p)})
		}
	}
	return s
}

// packageSkips counts the tests that did not run for want of a package.
func (s summary) packageSkips() int {
	n := 0
	for _, m := range s.skipped {
		if m.need.kind == "package" {
			n++
		}
	}
	return n
}

// The kinds in the order the summary shows them, each with what it says
// of its tests.
var kinds = []struct{ kind, says string }{
	{"package", "need Debian packages"},
	{"corpus", "need the corpus of memory pages"},
	{"module", "need a kernel module"},
	{"root", "need root"},
	{"limit", "need a higher resource limit (ulimit)"},
	{"opt-in", "are opt-in: each runs when its variable is set"},
	{"machine", "cannot run on this machine"},
	{"other", "skipped for other reasons"},
	{"helper", "are bodies of processes other tests start, and ran there"},
}

func (s summary) write(w io.Writer, list bool) {
	helpers := 0
	for _, m := range s.skipped {
		if m.need.kind == "helper" {
			helpers++
		}
	}
	fmt.Fprintf(w, "\n== make test: %d tests ran, %d failed; %d did not run", s.ran, len(s.failed), len(s.skipped)-helpers)
	if helpers > 0 {
		fmt.Fprintf(w, " (and %d ran inside other tests)", helpers)
	}
	fmt.Fprintf(w, "; %d ran without one of their checks ==\n", len(s.parts))
	if len(s.failed) > 0 {
		fmt.Fprintln(w, "Failed (their output is above):")
		for _, t := range s.failed {
			fmt.Fprintf(w, "      %s\n", t)
		}
	}
	for _, name := range s.absent {
		fmt.Fprintf(w, "No results in %s: its go test did not run (see above)\n", name)
	}
	if len(s.skipped) > 0 {
		fmt.Fprintln(w, "Did not run:")
		writeGroups(w, s.skipped, list)
	}
	if len(s.parts) > 0 {
		fmt.Fprintln(w, "Ran without a check:")
		writeGroups(w, s.parts, list)
	}
	if fixes := fixes(append(slices.Clone(s.skipped), s.parts...)); len(fixes) > 0 {
		fmt.Fprintln(w, "To run the rest:")
		for _, f := range fixes {
			fmt.Fprintln(w, "  "+f)
		}
	}
	if !list && len(s.skipped) > helpers {
		fmt.Fprintln(w, "(make test TEST_REPORT_FLAGS=-list names each test)")
	}
	// The plain closing line that CI and scripts read.
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", s.ran-len(s.failed), len(s.failed), len(s.skipped)-helpers)
}

// writeGroups writes one line per kind of need, then one per distinct
// need within it, each with its count.
func writeGroups(w io.Writer, ms []missing, list bool) {
	for _, k := range kinds {
		var of []missing
		for _, m := range ms {
			if m.need.kind == k.kind {
				of = append(of, m)
			}
		}
		if len(of) == 0 {
			continue
		}
		fmt.Fprintf(w, "  %3d %s\n", len(of), k.says)
		if k.kind == "helper" && !list {
			continue
		}
		byNeed := make(map[need][]string)
		for _, m := range of {
			byNeed[m.need] = append(byNeed[m.need], m.test)
		}
		needs := slices.SortedFunc(maps.Keys(byNeed), func(a, b need) int {
			return cmp.Or(len(byNeed[b])-len(byNeed[a]), strings.Compare(a.name, b.name), strings.Compare(a.detail, b.detail))
		})
		for _, n := range needs {
			label := n.detail
			if n.name != "" {
				label = n.name + ": " + n.detail
			}
			fmt.Fprintf(w, "      %3d %s\n", len(byNeed[n]), label)
			if list {
				for _, t := range byNeed[n] {
					fmt.Fprintf(w, "            %s\n", t)
				}
			}
		}
	}
}

// fixes are the commands, one per kind, that would run what did not.
func fixes(ms []missing) []string {
	names := make(map[string]map[string]bool)
	for _, m := range ms {
		if names[m.need.kind] == nil {
			names[m.need.kind] = make(map[string]bool)
		}
		names[m.need.kind][m.need.name] = true
	}
	sorted := func(kind string) []string {
		return slices.DeleteFunc(slices.Sorted(maps.Keys(names[kind])), func(s string) bool { return s == "" })
	}
	var out []string
	if pkgs := sorted("package"); len(pkgs) > 0 {
		out = append(out, "apt-get install "+strings.Join(pkgs, " "))
	}
	if names["corpus"] != nil {
		out = append(out, "GZRAMD_CORPUS=FILE make test, FILE a corpus captured here as root (go run ./internal/corpus/capture -o FILE), or the project's (../shared/corpus/memory-pages.bin.zst beside the repository on the project's machines)")
	}
	for _, mod := range sorted("module") {
		out = append(out, "modprobe "+mod+" (as root)")
	}
	if names["root"] != nil {
		out = append(out, "make test as root")
	}
	for _, limit := range sorted("limit") {
		out = append(out, limitFix(limit))
	}
	if vars := sorted("opt-in"); len(vars) > 0 {
		out = append(out, "opt-in, one at a time (each test's comment says what it needs): "+strings.Join(vars, " "))
	}
	return out
}

// limitFix is how to raise a resource limit (ulimit's name for it) for
// make test. An ordinary user cannot raise a hard limit: root can, for
// one shell or for the user's next login.
func limitFix(limit string) string {
	switch limit {
	case "memlock":
		return "an unlimited memlock limit: make test as root, or as root add the line '" +
			"USER - memlock unlimited' to /etc/security/limits.d/gzramd.conf, then log in again (ulimit -l says unlimited)"
	}
	return "raise the " + limit + " limit (ulimit), or make test as root"
}
