package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
)

//go:embed migration/*.sql
var migrationFS embed.FS

// Direction is the direction Migrate moves the schema.
type Direction int

// Migration directions.
const (
	DirectionUp Direction = iota
	DirectionDown
)

// MigrateOptions configure Migrate. A nil *MigrateOptions means the defaults.
type MigrateOptions struct {
	// Schema is the schema to migrate; it is created if missing. Defaults
	// to SchemaDefault.
	Schema string
	// Steps is how many migrations to apply; 0 means all (up) or one
	// (down), as River does, so a careless down call removes little.
	Steps int
}

// MigrateResult reports what Migrate did.
type MigrateResult struct {
	// Applied lists the versions applied (up) or reverted (down), in order.
	Applied []int
	// Version is the schema version after the call (0: none).
	Version int
}

type migration struct {
	version  int
	name     string
	up, down string
}

func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migration")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*migration{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("postgres: bad migration file name %q", name)
		}
		body, err := migrationFS.ReadFile(path.Join("migration", name))
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &migration{version: v}
			byVersion[v] = m
		}
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			m.name, m.up = strings.TrimSuffix(rest, ".up.sql"), string(body)
		case strings.HasSuffix(rest, ".down.sql"):
			m.down = string(body)
		}
	}
	out := make([]migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate brings the schema's tables to the latest version (DirectionUp) or
// reverts migrations (DirectionDown). It is idempotent and safe to call from
// several processes at once: it runs in one transaction holding an advisory
// lock on the schema, and records applied versions in
// <schema>.schema_migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, dir Direction, opts *MigrateOptions) (*MigrateResult, error) {
	if opts == nil {
		opts = &MigrateOptions{}
	}
	schema := opts.Schema
	if schema == "" {
		schema = SchemaDefault
	}
	if !schemaRE.MatchString(schema) {
		return nil, fmt.Errorf("%w: postgres: schema %q must be a lower-case SQL identifier", keyorder.ErrInvalidConfig, schema)
	}
	migs, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	q := pgx.Identifier{schema}.Sanitize()
	res := &MigrateResult{}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('keyorder.migrate'), hashtext($1))`, schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var current int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+q+`.schema_migrations`).Scan(&current); err != nil {
			return err
		}
		if dir == DirectionUp {
			for _, m := range migs {
				if m.version <= current || (opts.Steps > 0 && len(res.Applied) == opts.Steps) {
					continue
				}
				if _, err := tx.Exec(ctx, expand(m.up, q)); err != nil {
					return fmt.Errorf("postgres: migration %03d_%s: %w", m.version, m.name, err)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
					return err
				}
				res.Applied = append(res.Applied, m.version)
				current = m.version
			}
		} else {
			steps := max(opts.Steps, 1)
			for i := len(migs) - 1; i >= 0 && len(res.Applied) < steps; i-- {
				m := migs[i]
				if m.version > current {
					continue
				}
				if _, err := tx.Exec(ctx, expand(m.down, q)); err != nil {
					return fmt.Errorf("postgres: migration %03d_%s down: %w", m.version, m.name, err)
				}
				if _, err := tx.Exec(ctx, `DELETE FROM `+q+`.schema_migrations WHERE version = $1`, m.version); err != nil {
					return err
				}
				res.Applied = append(res.Applied, m.version)
				current = m.version - 1
			}
		}
		res.Version = current
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate schema %s: %w", schema, err)
	}
	return res, nil
}

// expand substitutes the quoted schema name into a query template.
func expand(sql, quotedSchema string) string {
	return strings.ReplaceAll(sql, "{{schema}}", quotedSchema)
}
