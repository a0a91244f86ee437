package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/pkg/serving"
)

// TestHoldingsMatchTheDesign: what a running daemon says it holds ahead of
// need (/status, the start-up log, gzramd_held_bytes) is what
// docs/DESIGN.md's swap-safety table lists, so that the table stays the
// one place to read it. Holdings that exist only with a GPU are in the
// table but not in this CPU daemon's list.
func TestHoldingsMatchTheDesign(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(line, "| holding | size | why | without it | owner |"):
			in = true
		case in && strings.HasPrefix(line, "|---"):
		case in && strings.HasPrefix(line, "| `"):
			documented = append(documented, strings.Trim(strings.TrimSpace(strings.Split(line, "|")[1]), "`"))
		default:
			in = false
		}
	}
	if len(documented) == 0 {
		t.Fatal("no holdings table in docs/DESIGN.md")
	}
	d := startDaemon(t, nil, "--size", "64MiB", "--backend", "cpu")
	body, err := fetch(context.Background(), "http://"+d.metrics+"/status")
	if err != nil {
		t.Fatal(err)
	}
	var rep serving.Status
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	// The GPU's, and the ublk device's: this daemon has neither.
	notHere := []string{"staging", "gpu-outputs", "gpu-slots", "ublk-buffers"}
	var listed []string
	for _, h := range rep.Holdings {
		listed = append(listed, h.Name)
		if h.Bytes <= 0 && h.Count <= 0 {
			t.Errorf("holding %q holds nothing", h.Name)
		}
		if h.Why == "" {
			t.Errorf("holding %q says not why", h.Name)
		}
		if !slices.Contains(documented, h.Name) {
			t.Errorf("the daemon holds %q, which docs/DESIGN.md does not list", h.Name)
		}
		if n := strings.Count(d.log.String(), `msg="holding for swap safety" what=`+h.Name+` `); n != 1 {
			t.Errorf("the start-up log names %q %d times, want once", h.Name, n)
		}
	}
	for _, name := range documented {
		if !slices.Contains(listed, name) && !slices.Contains(notHere, name) {
			t.Errorf("docs/DESIGN.md lists %q, which the daemon does not hold", name)
		}
	}
	f := d.scrape()
	if v, _ := f.Value("gzramd_held_bytes", "what", "page-table"); v != 64<<20/4096*8 {
		t.Errorf("gzramd_held_bytes{what=page-table} = %v, want 8 bytes per page", v)
	}
}
