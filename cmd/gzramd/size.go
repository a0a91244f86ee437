// Byte-count flags with units (4096, 512KiB, 8GiB).

package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gzramd/gzramd/pkg/serving"
)

// sizeValue is a byte count flag that accepts 4096, 512KiB, 8GiB, 1G, 1.5TiB.
type sizeValue int64

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*mult > 1<<62 {
		return 0, fmt.Errorf("want a size such as 1GiB, 512MiB or 4096, got %q", s)
	}
	return int64(f * mult), nil
}

func formatSize(n int64) string { return serving.Size(n).String() }

func (v *sizeValue) String() string { return formatSize(int64(*v)) }
func (v *sizeValue) Type() string   { return "size" }
func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}
