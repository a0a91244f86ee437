// Package fiotest reads what tests need to know from fio: whether it
// replays an iolog's trims, and the I/Os a run issued.
package fiotest

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
)

// ReplaysTrims reports whether the fio at path replays an iolog's trims
// (version 3.34 on).
func ReplaysTrims(tb testing.TB, path string) bool {
	tb.Helper()
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		tb.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(out), "fio-%d.%d", &major, &minor); err != nil {
		tb.Fatalf("fio --version: %q: %v", out, err)
	}
	return major > 3 || major == 3 && minor >= 34
}

// Issued returns the I/Os a run issued by direction (read, write, trim,
// sync), from fio's JSON report of one job; a job error fails the test.
func Issued(tb testing.TB, report []byte) map[string]int {
	tb.Helper()
	var r struct {
		Jobs []struct {
			Error int
			Read  struct {
				TotalIOs int `json:"total_ios"`
			}
			Write struct {
				TotalIOs int `json:"total_ios"`
			}
			Trim struct {
				TotalIOs int `json:"total_ios"`
			}
			Sync struct {
				TotalIOs int `json:"total_ios"`
			}
		}
	}
	if err := json.Unmarshal(report, &r); err != nil || len(r.Jobs) != 1 {
		tb.Fatalf("fio's JSON report: %v\n%s", err, report)
	}
	j := r.Jobs[0]
	if j.Error != 0 {
		tb.Errorf("fio reports error %d", j.Error)
	}
	return map[string]int{"read": j.Read.TotalIOs, "write": j.Write.TotalIOs, "trim": j.Trim.TotalIOs, "sync": j.Sync.TotalIOs}
}
