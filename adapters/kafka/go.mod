module github.com/keyorder/keyorder/adapters/kafka

go 1.26.0

toolchain go1.26.11

replace github.com/keyorder/keyorder => ../..

require (
	github.com/keyorder/keyorder v0.1.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	golang.org/x/time v0.16.0 // indirect
)
