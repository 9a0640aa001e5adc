// sdkgen writes the TypeScript SDK `pulumi package add` writes for a local component package (an npm package
// compiled by its postinstall script), from the package's schema, with Pulumi's own binder and generator.
// The Pulumi CLI's language plugins are not served by the module proxy; this is the code they run.
//
//	sdkgen SCHEMA.json OUTDIR
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)

func main() {
	if len(os.Args) != 3 {
		fail("usage: sdkgen SCHEMA.json OUTDIR")
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var spec schema.PackageSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		fail(os.Args[1], ": ", err)
	}
	// The schema names no other package, so nothing is loaded.
	pkg, diags, err := schema.BindSpec(spec, schema.NewNullLoader(), schema.ValidationOptions{})
	if err != nil || diags.HasErrors() {
		fail(os.Args[1], ": the schema does not bind: ", err, diags)
	}
	files, err := nodejs.GeneratePackage("pulumi", pkg, nil, nil, true, nil)
	if err != nil {
		fail("generate: ", err)
	}
	for name, content := range files {
		path := filepath.Join(os.Args[2], name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fail(err)
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(parts ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"sdkgen:"}, parts...)...)
	os.Exit(1)
}
