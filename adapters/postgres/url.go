package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Schemes registered on driver.DefaultMux.
const (
	Scheme     = "postgres"
	SchemeAlt  = "postgresql"
	paramTopic = "topic"
	paramSub   = "subscription"
)

// keyorderParams are the parameters keyorder reads from a PostgreSQL URL
// (see the package documentation); connParams go to pgx.
var keyorderParams = []string{
	paramTopic, paramSub, "schema", "migrate", "create", "ordering", "max_attempts", "min_backoff",
	"max_backoff", "compact", "lease", "max_batch", "chain", "poll", "notify_debounce",
	"vacuum_interval", "missing_key",
}

func init() {
	o := &URLOpener{}
	names := append([]string(nil), keyorderParams...)
	for p := range connParams {
		names = append(names, p)
	}
	for _, s := range []string{Scheme, SchemeAlt} {
		driver.RegisterParams(s, driver.Params{Names: names, Secret: []string{"sslpassword"}})
		driver.DefaultMux().RegisterTopic(s, o)
		driver.DefaultMux().RegisterSubscription(s, o)
	}
}

// connParams are the connection parameters passed through to pgx (they
// configure the pool, not keyorder). Any other parameter that is not one of
// keyorder's is rejected.
var connParams = map[string]bool{
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslkey": true, "sslpassword": true,
	"connect_timeout": true, "application_name": true, "target_session_attrs": true,
	"pool_max_conns": true, "pool_min_conns": true, "pool_max_conn_lifetime": true,
	"pool_max_conn_idle_time": true, "pool_health_check_period": true,
}

// URLOpener opens postgres:// and postgresql:// URLs (see the package
// documentation). Each opened Topic or Subscription owns a pool of its own,
// closed by its Close.
type URLOpener struct {
	// Options are the defaults the URL's parameters override. When
	// Options.Subscription is nil, a subscription the URL creates
	// (create=true) is Ordered unless the URL says otherwise, as on every
	// backend's URL.
	Options Options
}

// OpenTopicURL opens the topic named by the topic parameter.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	opts, topic, _, conn, err := o.parse(u)
	if err != nil {
		return nil, err
	}
	if topic == "" {
		return nil, driver.BadParam(u, paramTopic, "is required")
	}
	pool, err := newPool(ctx, u, conn)
	if err != nil {
		return nil, err
	}
	t, err := openTopic(ctx, pool, topic, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	t.ownsPool = true
	return t, nil
}

// OpenSubscriptionURL opens the subscription named by the topic and
// subscription parameters.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	opts, topic, sub, conn, err := o.parse(u)
	if err != nil {
		return nil, err
	}
	if topic == "" {
		return nil, driver.BadParam(u, paramTopic, "is required")
	}
	if sub == "" {
		return nil, driver.BadParam(u, paramSub, "is required")
	}
	pool, err := newPool(ctx, u, conn)
	if err != nil {
		return nil, err
	}
	s, err := openSubscription(ctx, pool, topic, sub, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownsPool = true
	return s, nil
}

// parse maps each keyorder query parameter onto one Options field and
// returns the connection string without them.
func (o *URLOpener) parse(u *url.URL) (opts *Options, topic, sub, conn string, err error) {
	c := o.Options
	// A URL without ordering creates an Ordered subscription, as every
	// backend's URL does (the typed SubscriptionOptions keep the zero
	// value, Parallel).
	so := SubscriptionOptions{Ordering: policy.Ordered}
	if c.Subscription != nil {
		so = *c.Subscription
	}
	ps, err := driver.Query(u)
	if err != nil {
		return nil, "", "", "", err
	}
	pass := url.Values{}
	for _, kv := range ps {
		name, v := kv.Name, kv.Value
		var perr error
		switch name {
		case paramTopic:
			topic = v
		case paramSub:
			sub = v
		case "schema":
			c.Schema = v
		case "migrate":
			c.Migrate, perr = strconv.ParseBool(v)
		case "create":
			c.Create, perr = strconv.ParseBool(v)
		case "ordering":
			so.Ordering, perr = policy.ParseOrdering(v)
		case "max_attempts":
			so.MaxAttempts, perr = strconv.Atoi(v)
		case "min_backoff":
			so.MinBackoff, perr = time.ParseDuration(v)
		case "max_backoff":
			so.MaxBackoff, perr = time.ParseDuration(v)
		case "compact":
			so.Compaction, perr = strconv.ParseBool(v)
		case "lease":
			c.Lease, perr = time.ParseDuration(v)
		case "max_batch":
			c.MaxBatch, perr = strconv.Atoi(v)
		case "chain":
			c.ChainLength, perr = strconv.Atoi(v)
		case "poll":
			c.PollInterval, perr = time.ParseDuration(v)
		case "notify_debounce":
			c.NotifyDebounce, perr = time.ParseDuration(v)
		case "vacuum_interval":
			c.VacuumInterval, perr = time.ParseDuration(v)
		case "missing_key":
			c.MissingKey, perr = policy.ParseMissingKey(v)
		default:
			switch {
			case connParams[name]:
				pass.Set(name, v)
			case driver.IsSensitiveParam(name):
				// Only sslpassword is a secret pgx reads from the query;
				// a password belongs in the userinfo (pgx would also
				// read ?password=, but keyorder passes on only
				// connParams).
				perr = errors.New("unknown parameter (put the password in the userinfo: postgres://user:password@host/db)")
			default:
				perr = errors.New("unknown parameter")
			}
		}
		if perr != nil {
			return nil, "", "", "", driver.BadParam(u, name, perr.Error())
		}
	}
	c.Subscription = &so
	opts = c.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, "", "", "", &driver.URLError{URL: driver.Redact(u), Err: err}
	}
	cu := *u
	cu.Scheme = Scheme
	cu.RawQuery = pass.Encode()
	return opts, topic, sub, cu.String(), nil
}

// poolConfig parses the connection string the URL leaves for pgx. Its error
// carries the redacted URL and no text of pgx's, which may quote the
// connection string.
func poolConfig(u *url.URL, conn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(conn)
	if err != nil {
		return nil, driver.BadURL(u, "not a valid PostgreSQL connection URL")
	}
	return cfg, nil
}

func newPool(ctx context.Context, u *url.URL, conn string) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(u, conn)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, &driver.URLError{URL: driver.Redact(u), Err: fmt.Errorf("%w: %v", keyorder.ErrBadURL, err)}
	}
	return pool, nil
}

// ErrorCode classifies the errors of the opener (driver.ErrorCoder).
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return ErrorCode(err) }
