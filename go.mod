module github.com/keyorder/keyorder

go 1.26.0

toolchain go1.26.11

require github.com/google/uuid v1.6.0

require golang.org/x/time v0.16.0
