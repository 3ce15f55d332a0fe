module github.com/keyorder/keyorder/adapters/nats

go 1.26.0

toolchain go1.26.11

replace github.com/keyorder/keyorder => ../..

require (
	github.com/keyorder/keyorder v0.1.0
	github.com/nats-io/nats.go v1.56.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
