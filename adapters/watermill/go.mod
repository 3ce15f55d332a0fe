module github.com/keyorder/keyorder/adapters/watermill

go 1.26.0

toolchain go1.26.11

replace github.com/keyorder/keyorder => ../..

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/keyorder/keyorder v0.1.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/time v0.16.0 // indirect
)
