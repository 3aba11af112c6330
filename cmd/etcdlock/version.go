package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version returns etcdlock's module version as the build recorded it:
// v1.2.3 from go install ...@v1.2.3, "(devel)" from a checkout.
func version() string {
	v := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return fmt.Sprintf("etcdlock %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
