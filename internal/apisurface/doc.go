// Package apisurface holds a test of the portable API's surface: an
// application using publish and subscribe never needs a type of package
// adapters, except to hand a driver to New.
package apisurface
