package pipeline

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDesignImports checks docs/DESIGN.md's package graph against the
// code: each package listed imports exactly the gzramd packages its row
// names (test files aside), and every gzramd package that imports another
// has a row.
func TestDesignImports(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := map[string][]string{}
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(line, "| package | imports |"):
			in = true
		case in && strings.HasPrefix(line, "|---"):
		case in && strings.HasPrefix(line, "| "):
			cells := strings.Split(line, "|")
			table[strings.TrimSpace(cells[1])] = strings.Fields(cells[2])
		default:
			in = false
		}
	}
	if len(table) == 0 {
		t.Fatal("no package table in docs/DESIGN.md")
	}
	const module = "github.com/gzramd/gzramd/"
	for _, dir := range []string{"cmd", "pkg", "internal"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			pkg := dir + "/" + e.Name()
			imports := importsOf(t, filepath.Join(root, pkg), module)
			want, listed := table[pkg]
			if !listed {
				if len(imports) > 0 && dir != "internal" {
					t.Errorf("%s imports %v but has no row in docs/DESIGN.md's package graph", pkg, imports)
				}
				continue
			}
			slices.Sort(want)
			if !slices.Equal(imports, want) {
				t.Errorf("%s imports %v; docs/DESIGN.md says %v", pkg, imports, want)
			}
			delete(table, pkg)
		}
	}
	for pkg := range table {
		t.Errorf("docs/DESIGN.md lists %s, which does not exist", pkg)
	}
}

// importsOf returns the module's packages that the non-test Go files of
// dir import, sorted, without the module prefix.
func importsOf(t *testing.T, dir, module string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, module) {
				seen[strings.TrimPrefix(p, module)] = true
			}
		}
	}
	var out []string
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestDesignNamesEveryPackage checks that docs/DESIGN.md's "Where to look"
// names every package of the module, and that the README's map names
// none that does not exist.
func TestDesignNamesEveryPackage(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, where, ok := strings.Cut(string(doc), "## Where to look")
	if !ok {
		t.Fatal(`docs/DESIGN.md has no "Where to look"`)
	}
	where, _, _ = strings.Cut(where, "\n## ")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`((?:cmd|pkg|internal)/[a-z0-9/]+)`").FindAllStringSubmatch(where, -1) {
		named[strings.TrimSuffix(m[1], "/")] = true
	}
	var packages []string
	for _, dir := range []string{"cmd", "pkg", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				if d != nil && d.IsDir() && d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return err
			}
			if goFiles, _ := filepath.Glob(filepath.Join(path, "*.go")); len(goFiles) > 0 {
				rel, _ := filepath.Rel(root, path)
				packages = append(packages, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	exists := map[string]bool{}
	for _, pkg := range packages {
		exists[pkg] = true
		if !named[pkg] {
			t.Errorf("docs/DESIGN.md's \"Where to look\" does not name %s", pkg)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\b((?:pkg|internal)/[a-z0-9]+(?:/[a-z0-9]+)?)\b`).FindAllStringSubmatch(string(readme), -1) {
		if name := m[1]; !exists[name] && !exists[filepath.Dir(name)] {
			t.Errorf("the README names %s, which is no package", name)
		}
	}
}
