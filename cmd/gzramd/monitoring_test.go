package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/metrics"
)

const (
	grafanaDir = "../../deploy/grafana"
	rulesFile  = "../../deploy/prometheus/gzramd-rules.yml"
	rulesTest  = "../../deploy/prometheus/gzramd-rules.test.yml"
)

// TestSwapMetrics checks that gzramd_swap_active follows the detection
// `gzramd status` uses, on a stand-in kernel whose /dev/nbd7 is swap set
// up by this test's connection.
func TestSwapMetrics(t *testing.T) {
	env, swaps := fakeKernel(t, os.Getpid())
	d := startDaemon(t, env, append(hardeningOff, "--backend", "cpu")...)
	want := func(name string, v float64) {
		t.Helper()
		if got, ok := d.scrape().Value(name); !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, v)
		}
	}
	want("gzramd_swap_active", 0) // nothing connected yet: nbd7 is someone else's
	want("gzramd_swap_expected", 0)
	if _, ok := d.scrape().Value("gzramd_kernel_device_attached"); ok {
		t.Error("gzramd_kernel_device_attached exported without --device")
	}

	dialRaw(t, d.socket)
	time.Sleep(100 * time.Millisecond)
	want("gzramd_swap_active", 1)
	writeSwaps(t, swaps, false) // swapoff
	want("gzramd_swap_active", 0)
}

// query is one PromQL expression of the dashboard or the rules, and
// where it is, for messages.
type query struct{ where, expr string }

// Just the parts of a Grafana dashboard that Grafana needs to show it.
type (
	grafanaDashboard struct {
		Title, UID    string
		SchemaVersion int
		Panels        []grafanaPanel
		Templating    struct{ List []grafanaVariable }
	}
	grafanaPanel struct {
		ID          int
		Type, Title string
		GridPos     struct{ H, W, X, Y int }
		Datasource  *grafanaDatasource
		Targets     []grafanaTarget
		Panels      []grafanaPanel // a collapsed row's
	}
	grafanaTarget struct {
		RefID      string
		Expr       string
		Datasource *grafanaDatasource
	}
	grafanaDatasource struct{ Type, UID string }
	grafanaVariable   struct {
		Name, Type string
		Query      any // a string, or {"query": ...}
		Datasource *grafanaDatasource
	}
)

// dashboardQueries reads every dashboard in deploy/grafana, fails the
// test where Grafana would not show it as meant, and returns its queries.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(grafanaDir, "*.json"))
	if len(files) == 0 {
		t.Fatal("no dashboards in " + grafanaDir)
	}
	var qs []query
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d grafanaDashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		name := filepath.Base(file)
		if d.Title == "" || d.UID == "" || d.SchemaVersion < 36 || len(d.Panels) == 0 {
			t.Errorf("%s: want a title, a uid, schemaVersion 36 or later (Grafana 9+) and panels", name)
		}
		// Panels name their data source through a variable, so that an
		// import works whatever the Prometheus data source is called.
		var dsVar, instanceVar *grafanaVariable
		for i, v := range d.Templating.List {
			switch {
			case v.Type == "datasource" && v.Query == "prometheus":
				dsVar = &d.Templating.List[i]
			case v.Type == "query" && v.Name == "instance":
				instanceVar = &d.Templating.List[i]
			}
		}
		if dsVar == nil || instanceVar == nil {
			t.Fatalf("%s: want a Prometheus data source variable and a query variable named instance", name)
		}
		ds := grafanaDatasource{Type: "prometheus", UID: "${" + dsVar.Name + "}"}
		if instanceVar.Datasource == nil || *instanceVar.Datasource != ds {
			t.Errorf("%s: the instance variable's datasource is %+v, want %+v", name, instanceVar.Datasource, ds)
		}
		vq, _ := instanceVar.Query.(string)
		if m, ok := instanceVar.Query.(map[string]any); ok {
			vq, _ = m["query"].(string)
		}
		if vq == "" {
			t.Errorf("%s: the instance variable has no query", name)
		} else {
			qs = append(qs, query{name + ": variable instance", vq})
		}

		ids := map[int]bool{}
		var walk func(ps []grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				where := fmt.Sprintf("%s: panel %d %q", name, p.ID, p.Title)
				if p.ID == 0 || ids[p.ID] {
					t.Errorf("%s: want an id of its own", where)
				}
				ids[p.ID] = true
				g := p.GridPos
				if p.Type == "" || p.Title == "" || g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
					t.Errorf("%s: want a type, a title and a gridPos within 24 columns, have %q %+v", where, p.Type, g)
				}
				if p.Type == "row" {
					walk(p.Panels)
					continue
				}
				if p.Datasource == nil || *p.Datasource != ds || len(p.Targets) == 0 {
					t.Errorf("%s: want datasource %+v and targets", where, ds)
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.RefID == "" || refs[tg.RefID] || tg.Expr == "" || tg.Datasource == nil || *tg.Datasource != ds {
						t.Errorf("%s: target %q: want a refId of its own, an expr and datasource %+v", where, tg.RefID, ds)
					}
					refs[tg.RefID] = true
					// Every metric it reads, or a panel mixes instances.
					sels, _ := selectors(tg.Expr) // errors are the drift test's
					for _, s := range sels {
						if !slices.Contains(s.labels, "instance") || !strings.Contains(tg.Expr, `instance=~"$instance"`) {
							t.Errorf("%s: target %s reads %s without instance=~\"$instance\"", where, tg.RefID, s.name)
						}
					}
					qs = append(qs, query{where + " target " + tg.RefID, tg.Expr})
				}
			}
		}
		walk(d.Panels)
	}
	return qs
}

// alertRules is deploy/prometheus's rule file.
type alertRules struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert, Record, Expr string
			Labels, Annotations map[string]string
		}
	}
}

func readRules(t *testing.T) alertRules {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var r alertRules
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return r
}

func ruleQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{"rule " + r.Alert + r.Record, r.Expr})
		}
	}
	if len(qs) == 0 {
		t.Fatal("no rules in " + rulesFile)
	}
	return qs
}

// selector is a metric a query reads, with the labels its matchers name.
type selector struct {
	name   string
	labels []string
}

// promqlKeywords are the words of PromQL that are not metric names; the
// first group take a list of label names in parentheses.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": false, "or": false, "unless": false, "bool": false, "offset": false, "atan2": false,
	"inf": false, "nan": false, "Inf": false, "NaN": false,
	"sum": false, "avg": false, "min": false, "max": false, "count": false, "group": false,
	"stddev": false, "stdvar": false, "count_values": false, "topk": false, "bottomk": false,
	"quantile": false, "limitk": false, "limit_ratio": false,
}

// matcherRE is one label matcher: name, operator, quoted value.
var matcherRE = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`)")

// skipString returns the index just past the quoted string at s[i]:
// backslashes escape in double and single quotes, not in backquotes.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", i)
}

// selectors returns the metrics expr reads. It knows enough PromQL (and
// Grafana's variables and label_values) for the dashboard and the rules,
// and reports what it cannot read rather than skip it.
func selectors(expr string) ([]selector, error) {
	var out []selector
	s := expr
	depth := 0 // of parentheses
	// closing returns the index just past the bracket that closes the
	// one at i, skipping quoted strings.
	closing := func(i int) (int, error) {
		open, depth := s[i], 0
		end := map[byte]byte{'(': ')', '[': ']', '{': '}'}[open]
		for j := i; j < len(s); j++ {
			switch c := s[j]; c {
			case '"', '\'', '`':
				k, err := skipString(s, j)
				if err != nil {
					return 0, err
				}
				j = k - 1
			case open:
				depth++
			case end:
				if depth--; depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unclosed %c at %d", open, i)
	}
	ident := func(i int) int {
		j := i
		for j < len(s) && (s[j] == '_' || s[j] == ':' || 'a' <= s[j]|0x20 && s[j]|0x20 <= 'z' || j > i && '0' <= s[j] && s[j] <= '9') {
			j++
		}
		return j
	}
	next := func(i int) byte {
		for ; i < len(s); i++ {
			if s[i] != ' ' && s[i] != '\t' && s[i] != '\n' {
				return s[i]
			}
		}
		return 0
	}
	labelNames := func(m string) []string {
		var names []string
		for _, part := range matcherRE.FindAllStringSubmatch(m, -1) {
			names = append(names, part[1])
		}
		return names
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			k, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = k
		case c == '$': // a Grafana variable: $name or ${name}
			i++
			if i < len(s) && s[i] == '{' {
				j, err := closing(i)
				if err != nil {
					return nil, err
				}
				i = j
			} else {
				i = ident(i)
			}
		case c == '[': // a range or subquery: durations and variables
			j, err := closing(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d", i)
		case '0' <= c && c <= '9' || c == '.': // a number or a duration
			for i < len(s) && (s[i] == '.' || '0' <= s[i] && s[i] <= '9' || 'a' <= s[i]|0x20 && s[i]|0x20 <= 'z') {
				i++
			}
		case c == '_' || c == ':' || 'a' <= c|0x20 && c|0x20 <= 'z':
			j := ident(i)
			word := s[i:j]
			i = j
			if takesLabels, ok := promqlKeywords[word]; ok {
				if takesLabels && next(i) == '(' {
					k, err := closing(strings.IndexByte(s[i:], '(') + i)
					if err != nil {
						return nil, err
					}
					i = k
				}
				continue
			}
			if next(i) == '(' {
				if word != "label_values" {
					continue // a function: its arguments are read as the rest
				}
				// Grafana's label_values(selector, label).
				open := strings.IndexByte(s[i:], '(') + i
				k, err := closing(open)
				if err != nil {
					return nil, err
				}
				args := s[open+1 : k-1]
				comma := strings.LastIndexByte(args, ',')
				if comma < 0 {
					return nil, fmt.Errorf("label_values without a metric: %s", s[i:k])
				}
				sel, err := selectors(args[:comma])
				if err != nil || len(sel) != 1 {
					return nil, fmt.Errorf("label_values(%s): want one selector (%v)", args, err)
				}
				sel[0].labels = append(sel[0].labels, strings.TrimSpace(args[comma+1:]))
				out = append(out, sel[0])
				i = k
				continue
			}
			sel := selector{name: word}
			if next(i) == '{' {
				open := strings.IndexByte(s[i:], '{') + i
				k, err := closing(open)
				if err != nil {
					return nil, err
				}
				sel.labels = labelNames(s[open+1 : k-1])
				i = k
			}
			out = append(out, sel)
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("unopened ) at %d", i)
			}
			i++
		default:
			i++
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("%d unclosed (", depth)
	}
	return out, nil
}

func TestSelectors(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []selector
	}{
		{`up{job="gzramd"} == 0`, []selector{{"up", []string{"job"}}}},
		{`absent(up{job="gzramd"})`, []selector{{"up", []string{"job"}}}},
		{`histogram_quantile(0.99, sum by (instance, command, le) (rate(gzramd_nbd_request_duration_seconds_bucket{instance=~"$instance", command=~"read|write"}[$__rate_interval])))`,
			[]selector{{"gzramd_nbd_request_duration_seconds_bucket", []string{"instance", "command"}}}},
		{"sum(rate(a_total[5m])) without (x) / on (instance) group_left (y) b offset 1h > bool 1e3 unless c{d='}'}",
			[]selector{{"a_total", nil}, {"b", nil}, {"c", []string{"d"}}}},
		{"gzramd_mem_used_bytes / (gzramd_mem_limit_bytes > 0) > 0.9",
			[]selector{{"gzramd_mem_used_bytes", nil}, {"gzramd_mem_limit_bytes", nil}}},
		{"sum by (instance) (x) / count without (y) (z)", []selector{{"x", nil}, {"z", nil}}},
		{"label_values(gzramd_info, instance)", []selector{{"gzramd_info", []string{"instance"}}}},
		{`x{l="a,b=\"c\""} + ${v} * $v`, []selector{{"x", []string{"l"}}}},
	} {
		got, err := selectors(c.expr)
		if err != nil {
			t.Errorf("selectors(%s): %v", c.expr, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("selectors(%s) = %v, want %v", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`{__name__="x"}`, `x{l="a}`, `rate(x[5m]`, `label_values(instance)`} {
		if got, err := selectors(bad); err == nil {
			t.Errorf("selectors(%s) = %v, want an error", bad, got)
		}
	}
}

// TestDashboardAndRulesUseExportedMetrics keeps the dashboard and the
// alert rules from drifting away from the code: every metric they query
// must be in a real daemon's scrape, with the labels the queries match
// on, or, where this machine cannot make a daemon export it (the GPU's,
// the kernel device's), described by its collector.
func TestDashboardAndRulesUseExportedMetrics(t *testing.T) {
	qs := append(dashboardQueries(t), ruleQueries(t)...)

	// A limit a few hundred incompressible pages exceed, so that writes
	// also fail with ENOSPC and its error series exists.
	d := startDaemon(t, nil, append(hardeningOff, "--backend", "cpu", "--size", "64MiB", "--mem-limit", "1MiB")...)
	c := dialRaw(t, d.socket)
	page := make([]byte, 4096)
	var enospc bool
	for i := uint64(0); i < 4096 && !enospc; i++ {
		rand.Read(page)
		errno, err := c.Write(i*4096, page)
		if err != nil {
			t.Fatal(err)
		}
		enospc = errno == uint32(syscall.ENOSPC)
	}
	if !enospc {
		t.Fatal("16 MiB of pages written under a 1 MiB --mem-limit without ENOSPC")
	}
	// A request is counted once its reply is written: the scrape may
	// come first.
	scrape := d.scrape()
	for deadline := time.Now().Add(5 * time.Second); scrape["gzramd_nbd_request_errors_total"] == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		scrape = d.scrape()
	}
	exported := map[string]map[string]bool{} // metric name: its labels
	for name, fam := range scrape {
		labels := map[string]bool{}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		exported[name] = labels
		if fam.GetType() == dto.MetricType_HISTOGRAM {
			exported[name+"_count"], exported[name+"_sum"] = labels, labels
			exported[name+"_bucket"] = map[string]bool{"le": true}
			for l := range labels {
				exported[name+"_bucket"][l] = true
			}
		}
	}
	for name, labels := range described(t, metrics.NewGPU(0, nil, nil, nil)) {
		if _, ok := exported[name]; ok {
			t.Errorf("%s is in a CPU daemon's scrape: the GPU collector's metrics should be the GPU's alone", name)
		}
		exported[name] = labels
	}
	// gzramd_kernel_device_attached needs --device, and so root and the
	// nbd module.
	for name, labels := range described(t, metrics.NewKernel(nil)) {
		if _, ok := exported[name]; !ok {
			exported[name] = labels
		}
	}
	// The ublk device's requests need --transport ublk, and so root
	// and ublk_drv.
	for name, labels := range described(t, metrics.NewUblk()) {
		if _, ok := exported[name]; ok {
			t.Errorf("%s is in an NBD daemon's scrape: the ublk device's requests should be counted only over ublk", name)
		}
		exported[name] = labels
		if strings.HasSuffix(name, "_seconds") {
			exported[name+"_bucket"] = map[string]bool{"le": true, "command": true}
		}
	}
	// Series that Prometheus makes itself.
	exported["up"] = map[string]bool{}

	n := 0
	for _, q := range qs {
		sels, err := selectors(q.expr)
		if err != nil || len(sels) == 0 {
			t.Errorf("%s: cannot tell which metrics %q reads: %v", q.where, q.expr, err)
			continue
		}
		for _, s := range sels {
			labels, ok := exported[s.name]
			if !ok {
				t.Errorf("%s queries %s, which gzramd does not export", q.where, s.name)
				continue
			}
			for _, l := range s.labels {
				if !labels[l] && l != "job" && l != "instance" { // job and instance are the scrape's
					t.Errorf("%s matches %s on label %q, which it does not have", q.where, s.name, l)
				}
			}
			n++
		}
	}
	t.Logf("%d queries read %d metrics", len(qs), n)
}

// described returns the metrics c describes, with their labels.
func described(t *testing.T, c prometheus.Collector) map[string]map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	re := regexp.MustCompile(`^Desc\{fqName: ("[^"\\]*"), .*variableLabels: \{([^}]*)\}\}$`)
	out := map[string]map[string]bool{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the metric's name from %s", d)
		}
		name, _ := strconv.Unquote(m[1])
		labels := map[string]bool{}
		for _, l := range strings.Split(m[2], ",") {
			labels[l] = true
		}
		out[name] = labels
	}
	if len(out) == 0 {
		t.Fatalf("%T describes no metrics", c)
	}
	return out
}

// TestAlertRules runs promtool's checks and the rules' unit tests, and
// checks what promtool does not: each alert tells the operator what to
// do, has a severity, and has test cases that fire it and that do not.
func TestAlertRules(t *testing.T) {
	rules := readRules(t)
	firing, quiet := map[string]bool{}, map[string]bool{}
	b, err := os.ReadFile(rulesTest)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string
				ExpAlerts []any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		}
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatalf("%s: %v", rulesTest, err)
	}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || len(r.Annotations["description"]) < 80 {
				t.Errorf("%s: want a summary and a description that says what to do", r.Alert)
			}
			if !firing[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: %s lacks a case where it fires (%v) or one where it does not (%v)", r.Alert, rulesTest, firing[r.Alert], quiet[r.Alert])
			}
		}
	}

	promtool := testneeds.Command(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTest}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboardQueriesParse has promtool parse every dashboard query, as
// a recording rule, with Grafana's variables filled in.
func TestDashboardQueriesParse(t *testing.T) {
	qs := dashboardQueries(t)
	promtool := testneeds.Command(t, "promtool", "prometheus")
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$instance", ".+")
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range qs {
		if strings.HasPrefix(q.expr, "label_values(") {
			continue // Grafana's, not PromQL
		}
		rules = append(rules, rule{fmt.Sprintf("dashboard_query_%d", i), vars.Replace(q.expr)})
	}
	// JSON is YAML.
	b, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
		for _, r := range rules {
			t.Logf("%s: %s", r.Record, r.Expr)
		}
	}
}
