// Command testreport runs go test -json, shows what go test shows without
// -v, and records every test's outcome; its summary, which ends make test,
// says which tests did not run and why, grouped by what they need
// (internal/testneeds), and the commands that would run them.
//
//	testreport run -o FILE -- go test -json ./...
//	testreport summary [-list] [-ci] FILE...
//
// summary fails when a test failed or a run left no records; with -ci
// (make test under CI=true) also when a test skipped for want of a Debian
// package: .ci/run installs them all.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runCmd(os.Args[2:])
	case "summary":
		err = summaryCmd(os.Args[2:])
	default:
		usage()
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testreport run -o FILE -- go test -json ARGS...\n       testreport summary [-list] [-ci] FILE...")
	os.Exit(2)
}

// runCmd runs the go test command after "--", shows its output as go test
// without -v would, and writes each test's record to the -o file. It
// returns the command's own failure, if any.
func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	out := fs.String("o", "", "file to write the tests' records to (JSON lines)")
	fs.Parse(args)
	cmdArgs := fs.Args()
	if *out == "" || len(cmdArgs) == 0 {
		usage()
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	rec := newRecorder(os.Stdout, f)
	readErr := rec.read(stdout)
	waitErr := cmd.Wait()
	closeErr := f.Close()
	return errors.Join(waitErr, readErr, closeErr)
}

func summaryCmd(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ExitOnError)
	list := fs.Bool("list", false, "name each test that did not run")
	ci := fs.Bool("ci", false, "fail when a test skipped for want of a Debian package")
	fs.Parse(args)
	if fs.NArg() == 0 {
		usage()
	}
	var records []record
	var absent []string
	for _, name := range fs.Args() {
		rs, err := readRecords(name)
		if errors.Is(err, os.ErrNotExist) {
			// Its go test did not run: the summary still ends make test.
			absent = append(absent, name)
			continue
		}
		if err != nil {
			return err
		}
		records = append(records, rs...)
	}
	s := summarize(records)
	s.absent = absent
	s.write(os.Stdout, *list)
	switch {
	case len(s.failed) > 0:
		return fmt.Errorf("%d tests failed", len(s.failed))
	case len(absent) > 0:
		return fmt.Errorf("%d runs of go test left no results", len(absent))
	case *ci && s.packageSkips() > 0:
		return fmt.Errorf("%d tests skipped for want of a Debian package, and CI installs them all (.ci/run)", s.packageSkips())
	}
	return nil
}
