package nbd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// BenchmarkFio measures 4 KiB random IOPS with fio's nbd engine against
// this server (in-memory backend) and against nbdkit's memory plugin, the
// reference C server, in the same run. It reports IOPS for each and the
// ratio (gzramd/nbdkit). Each b.N iteration is one fio run of -fio.runtime.
func BenchmarkFio(b *testing.B) {
	testneeds.Command(b, "fio", "fio")
	_, nbdkit := testneeds.CommandFor(b, "nbdkit", "nbdkit", "no comparison with nbdkit's memory plugin, the reference C server")
	for _, rw := range []string{"randwrite", "randread"} {
		for _, qd := range []int{1, 32} {
			for _, jobs := range []int{1, 4} {
				name := fmt.Sprintf("%s/qd%d/conns%d", rw, qd, jobs)
				b.Run(name, func(b *testing.B) {
					mem := nbdtest.NewMemBackend(256 << 20)
					ts := startServer(b, []Export{{Name: "", Backend: mem}}, Options{})
					var ours, theirs float64
					for i := 0; i < b.N; i++ {
						ours += fioIOPS(b, ts.uri(""), rw, qd, jobs)
						if nbdkit {
							theirs += fioIOPS(b, startNbdkit(b), rw, qd, jobs)
						}
					}
					b.ReportMetric(ours/float64(b.N), "gzramd-iops")
					if theirs > 0 {
						b.ReportMetric(theirs/float64(b.N), "nbdkit-iops")
						b.ReportMetric(ours/theirs, "ratio")
					}
				})
			}
		}
	}
}

func startNbdkit(b *testing.B) string {
	sock := filepath.Join(b.TempDir(), "nbdkit.sock")
	cmd := exec.Command("nbdkit", "-f", "-U", sock, "memory", "256M")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for range 200 {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "nbd+unix:///?socket=" + sock
}

func fioIOPS(b *testing.B, uri, rw string, qd, jobs int) float64 {
	runtime := "3"
	if testing.Short() {
		runtime = "1"
	}
	args := []string{"--name=bench", "--ioengine=nbd", "--uri=" + uri,
		"--rw=" + rw, "--bs=4k", fmt.Sprintf("--iodepth=%d", qd), fmt.Sprintf("--numjobs=%d", jobs),
		"--size=256M", "--time_based", "--runtime=" + runtime, "--group_reporting",
		"--output-format=json"}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		b.Fatalf("fio: %v\n%s", err, out)
	}
	var res struct {
		Jobs []struct {
			Read  struct{ IOPS float64 } `json:"read"`
			Write struct{ IOPS float64 } `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before the JSON document.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	return res.Jobs[0].Read.IOPS + res.Jobs[0].Write.IOPS
}
