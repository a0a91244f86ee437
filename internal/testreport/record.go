package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output events
}

// record is a test's outcome in one run, as run writes it.
type record struct {
	Package string
	Test    string
	Result  string   // pass, fail or skip
	Skip    string   // the skip message
	Parts   []string // the checks it did not run (testneeds.Part)
}

// needRE matches a testneeds message, after the file:line prefix the
// testing package writes: needs KIND [NAME]: DETAIL.
var needRE = regexp.MustCompile(`needs (package|corpus|module|root|limit|opt-in|machine|helper)(?: ([^\s:]+))?: (.*)$`)

// partPrefix is testneeds.PartPrefix.
const partPrefix = "did not check all: "

// recorder shows go test's output as go test without -v does and
// collects each test's record.
type recorder struct {
	show   io.Writer
	out    *json.Encoder
	output map[string][]string // each running test's output lines
}

func newRecorder(show, out io.Writer) *recorder {
	return &recorder{show: show, out: json.NewEncoder(out), output: make(map[string][]string)}
}

// read consumes go test -json's stdout. Lines that are not JSON (a test
// binary's own writes to stdout outside any test) are shown as they are.
func (r *recorder) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(r.show, "%s\n", line)
			continue
		}
		if err := r.event(e); err != nil {
			return err
		}
	}
	return sc.Err()
}

func (r *recorder) event(e event) error {
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.show, e.Output)
	case e.Test == "":
		// The package's own lines: "ok", "FAIL", "?", panics outside a
		// test. -json implies -v, whose bare PASS lines go test hides.
		if e.Action == "output" && e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "testing: warning: no tests to run") {
			fmt.Fprint(r.show, e.Output)
		}
		if e.Action == "fail" {
			r.showUnfinished(e.Package)
		}
	case e.Action == "output":
		key := e.Package + " " + e.Test
		r.output[key] = append(r.output[key], e.Output)
	case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
		key := e.Package + " " + e.Test
		lines := r.output[key]
		delete(r.output, key)
		if e.Action == "fail" {
			for _, l := range lines {
				fmt.Fprint(r.show, l)
			}
		}
		return r.out.Encode(outcome(e.Package, e.Test, e.Action, lines))
	}
	return nil
}

// showUnfinished shows the output of pkg's tests that never ended: its
// test binary died in them (a crash, a fatal error, a timeout), and what
// they wrote, the crash's trace included, is all that says why.
func (r *recorder) showUnfinished(pkg string) {
	var keys []string
	for key := range r.output {
		if strings.HasPrefix(key, pkg+" ") {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Fprintf(r.show, "--- %s did not finish: the test binary ended in it; its output:\n", key)
		for _, l := range r.output[key] {
			fmt.Fprint(r.show, l)
		}
		delete(r.output, key)
	}
}

// outcome makes a test's record from its output lines.
func outcome(pkg, test, result string, lines []string) record {
	rec := record{Package: pkg, Test: test, Result: result}
	var last string
	for _, l := range lines {
		msg := strings.TrimSpace(l)
		if msg == "" || strings.HasPrefix(msg, "=== ") || strings.HasPrefix(msg, "--- ") {
			continue
		}
		msg = stripFileLine(msg)
		if p, ok := strings.CutPrefix(msg, partPrefix); ok {
			rec.Parts = append(rec.Parts, p)
			continue
		}
		last = msg
	}
	if result == "skip" {
		rec.Skip = last
		// A skip message of several lines: the need is what counts.
		for _, l := range lines {
			if m := needRE.FindString(stripFileLine(strings.TrimSpace(l))); m != "" {
				rec.Skip = m
			}
		}
	}
	return rec
}

// fileLineRE is the "name_test.go:123: " the testing package puts before
// a test's log and skip lines.
var fileLineRE = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)

func stripFileLine(s string) string { return fileLineRE.ReplaceAllString(s, "") }

func readRecords(name string) ([]record, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rs []record
	dec := json.NewDecoder(f)
	for {
		var r record
		if err := dec.Decode(&r); err == io.EOF {
			return rs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rs = append(rs, r)
	}
}
