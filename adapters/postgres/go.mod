module github.com/keyorder/keyorder/adapters/postgres

go 1.26.0

toolchain go1.26.11

replace github.com/keyorder/keyorder => ../..

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/keyorder/keyorder v0.1.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)
