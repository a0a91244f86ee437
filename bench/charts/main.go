// Command charts draws the README's two charts as SVG from the CSV files
// in bench/results (make charts): the net memory gzramd and kernel zram
// save against the GiB swapped out, and the CPU per GB each spends on a
// recorded swap trace against the number of fio jobs. Standard library
// only; the SVG is written by hand.
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A series is one line of a chart: its name and its points.
type series struct {
	name string
	x, y []float64
}

var colors = []string{"#444444", "#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd"}

func main() {
	results := flag.String("results", "bench/results", "directory of the input CSV files")
	out := flag.String("out", "docs", "directory the SVG files are written to")
	flag.Parse()
	if err := run(*results, *out); err != nil {
		log.Fatal(err)
	}
}

func run(results, out string) error {
	mem, err := readCSV(filepath.Join(results, "memory-saved.csv"))
	if err != nil {
		return err
	}
	var saved []series
	const maxGiB = 4.0
	for _, r := range mem {
		ratio, err1 := strconv.ParseFloat(r[1], 64)
		own, err2 := strconv.ParseFloat(r[2], 64)
		if err1 != nil || err2 != nil || ratio <= 0 {
			return fmt.Errorf("memory-saved.csv: bad row %q", r)
		}
		s := series{name: fmt.Sprintf("%s (ratio %.2f, own %.0f MiB)", r[0], ratio, own)}
		for i := 0; i <= 40; i++ {
			x := maxGiB * float64(i) / 40
			s.x = append(s.x, x)
			s.y = append(s.y, x*(1-1/ratio)-own/1024)
		}
		saved = append(saved, s)
	}
	if err := write(filepath.Join(out, "memory-saved.svg"), chart{
		title:  "Net memory saved against GiB swapped out (own memory included)",
		xLabel: "GiB swapped out", yLabel: "GiB saved",
		series: saved, points: false,
		source: "bench/results/memory-saved.csv: dense-frames-h200-2026-11-28.md, footprint-h100-2026-11-26.md",
	}); err != nil {
		return err
	}

	tr, err := readCSV(filepath.Join(results, "trace-cpu-per-gb.csv"))
	if err != nil {
		return err
	}
	var cpu []series
	index := map[string]int{}
	for _, r := range tr {
		jobs, err1 := strconv.ParseFloat(r[1], 64)
		v, err2 := strconv.ParseFloat(r[2], 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("trace-cpu-per-gb.csv: bad row %q", r)
		}
		i, ok := index[r[0]]
		if !ok {
			i = len(cpu)
			index[r[0]] = i
			cpu = append(cpu, series{name: r[0]})
		}
		cpu[i].x = append(cpu[i].x, jobs)
		cpu[i].y = append(cpu[i].y, v)
	}
	return write(filepath.Join(out, "cpu-per-gb.svg"), chart{
		title:  "CPU per GB on a recorded swap trace (whole machine, QD 32, H100)",
		xLabel: "fio jobs", yLabel: "CPU-seconds per GB",
		series: cpu, points: true, yFromZero: true,
		source: "bench/results/trace-cpu-per-gb.csv: trace-grid-h100-2026-11-23-rounds.md, trace-zstd-h100-2026-11-25.md",
	})
}

// readCSV returns the rows of a CSV file after its header, skipping
// comment lines (#).
func readCSV(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no data", path)
	}
	return rows[1:], nil
}

type chart struct {
	title, xLabel, yLabel, source string
	series                        []series
	points, yFromZero             bool
}

const (
	width, height            = 760, 440
	left, right, top, bottom = 70, 20, 40, 150
)

func write(path string, c chart) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.draw(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (c chart) draw(w io.Writer) error {
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for i := range s.x {
			x0, x1 = math.Min(x0, s.x[i]), math.Max(x1, s.x[i])
			y0, y1 = math.Min(y0, s.y[i]), math.Max(y1, s.y[i])
		}
	}
	if c.yFromZero {
		y0 = math.Min(0, y0)
	}
	xt, yt := ticks(x0, x1), ticks(y0, y1)
	x0, x1 = math.Min(x0, xt[0]), math.Max(x1, xt[len(xt)-1])
	y0, y1 = math.Min(y0, yt[0]), math.Max(y1, yt[len(yt)-1])
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	px := func(x float64) float64 { return left + (x-x0)/(x1-x0)*pw }
	py := func(y float64) float64 { return top + (y1-y)/(y1-y0)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, esc(c.title))
	for _, t := range xt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", px(t), top, px(t), top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(t), top+ph+16, num(t))
	}
	for _, t := range yt {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, py(t), left+pw, py(t))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py(t)+4, num(t))
	}
	if y0 < 0 && y1 > 0 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888888"/>`+"\n", left, py(0), left+pw, py(0))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#888888"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+pw/2, top+ph+34, esc(c.xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, esc(c.yLabel))
	for i, s := range c.series {
		color := colors[i%len(colors)]
		dash := ""
		if strings.Contains(s.name, "as written") {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j := range s.x {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.x[j]), py(s.y[j])))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), color, dash)
		if c.points {
			for j := range s.x {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(s.x[j]), py(s.y[j]), color)
			}
		}
		ly := top + ph + 52 + float64(i)*16
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", left, ly-4, left+24, ly-4, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f">%s</text>`+"\n", left+30, ly, esc(s.name))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" fill="#666666">%s</text>`+"\n", left, height-6, esc(c.source))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ticks returns round tick values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	for v := math.Floor(lo/step) * step; v <= hi+step*1e-9; v += step {
		t = append(t, math.Round(v/step)*step)
	}
	if t[len(t)-1] < hi {
		t = append(t, t[len(t)-1]+step)
	}
	return t
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
