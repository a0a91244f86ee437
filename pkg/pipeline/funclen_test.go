package pipeline

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function outside tests may be (issue 37):
// past it, a function does several things, and its steps want names.
const maxFuncLines = 80

// maxMethods is the most methods a type may declare (issue 37): past it,
// a type does several jobs, and each wants a type of its own.
const maxMethods = 30

// TestFunctionLength checks that no function outside tests, in any
// package of the module, is longer than maxFuncLines, from its func
// keyword to its closing brace.
func TestFunctionLength(t *testing.T) {
	eachFunc(t, func(pkg string, fd *ast.FuncDecl, fset *token.FileSet) {
		lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		if lines > maxFuncLines {
			t.Errorf("%s.%s (%s) is %d lines, beyond %d: split it into steps with names", pkg, funcName(fd), fset.Position(fd.Pos()), lines, maxFuncLines)
		}
	})
}

// TestMethodCount checks that no type outside tests declares more than
// maxMethods methods.
func TestMethodCount(t *testing.T) {
	methods := map[string]int{}
	eachFunc(t, func(pkg string, fd *ast.FuncDecl, _ *token.FileSet) {
		if recv, _, ok := strings.Cut(funcName(fd), "."); ok && fd.Recv != nil {
			methods[pkg+"."+recv]++
		}
	})
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("%s has %d methods, beyond %d: give its jobs types of their own", typ, n, maxMethods)
		}
	}
}

// eachFunc calls fn with every function with a body outside tests, in
// every package of the module, and the package's directory.
func eachFunc(t *testing.T, fn func(pkg string, fd *ast.FuncDecl, fset *token.FileSet)) {
	t.Helper()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if path != root && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				fn(filepath.ToSlash(rel), fd, fset)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// funcName is fd's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
