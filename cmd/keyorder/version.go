package main

import (
	"runtime"
	"runtime/debug"
)

// versionJSON is what version --json prints.
type versionJSON struct {
	// Version is the module version of cmd/keyorder: its tag when
	// installed with go install ...@version, a pseudo-version stamped from
	// version control when built in a checkout, "(devel)" otherwise.
	Version string `json:"version"`
	// Library is the version of the keyorder library module linked in,
	// when the build recorded it.
	Library string `json:"library,omitempty"`
	// Go is the Go release the binary was built with.
	Go string `json:"go"`
	// Revision is the version-control commit built from, when recorded,
	// with Modified set when the checkout had uncommitted changes.
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// buildInfo reads the version from the binary's build information.
func buildInfo() versionJSON {
	v := versionJSON{Version: "(devel)", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/keyorder/keyorder" {
			v.Library = d.Version
			if d.Replace != nil && d.Replace.Version != "" {
				v.Library = d.Replace.Version
			}
		}
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (c *cli) version(args []string) error {
	fs := c.flags("version")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("version: takes no arguments, got %d", len(pos))
	}
	v := buildInfo()
	if c.json {
		return c.emitJSON(v)
	}
	c.printf("keyorder %s\n", v.Version)
	if v.Library != "" && v.Library != v.Version {
		c.printf("library  %s\n", v.Library)
	}
	c.printf("go       %s\n", v.Go)
	if v.Revision != "" {
		mod := ""
		if v.Modified {
			mod = " (modified)"
		}
		c.printf("commit   %s%s\n", v.Revision, mod)
	}
	return nil
}
