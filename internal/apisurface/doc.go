// Package apisurface holds tests of the house's shape: an application using
// publish and subscribe never needs a type of package driver, except to hand
// a driver to New; and no package imports one from a higher layer (the
// driver contract never depends on the portable packages, the portable
// packages never on a backend).
package apisurface
