package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// fakeTB records how Require ended the test.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeTB) Skipf(format string, a ...any)  { f.skip = fmt.Sprintf(format, a...) }

func TestRequire(t *testing.T) {
	for _, tc := range []struct {
		name            string
		env             map[string]string
		server          string
		want, fatal, sk string
	}{
		{name: "set", server: SQS, env: map[string]string{EnvSQSEndpoint: "http://127.0.0.1:1"}, want: "http://127.0.0.1:1"},
		{name: "set even in CI", server: Postgres, env: map[string]string{EnvCI: "true", EnvPostgresURL: "postgres://x"}, want: "postgres://x"},
		{name: "pulsar admin", server: PulsarAdmin, env: map[string]string{EnvPulsarAdminURL: "http://a"}, want: "http://a"},
		{name: "missing skips", server: Pulsar, sk: "./integration/test.sh"},
		{name: "missing in CI fails", server: Pulsar, env: map[string]string{EnvCI: "true"}, fatal: "pulsar server is required"},
		{name: "missing under launcher fails", server: PubSub, env: map[string]string{EnvTestEnv: "1"}, fatal: EnvPubSubEmulatorHost},
		{name: "CI=false skips", server: PubSub, env: map[string]string{EnvCI: "false"}, sk: "testenv up"},
		{name: "unknown server", server: "kafka", fatal: "unknown server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range append([]string{EnvCI, EnvTestEnv}, SettingVars...) {
				t.Setenv(k, tc.env[k])
			}
			f := &fakeTB{}
			got := Require(f, tc.server)
			if got != tc.want {
				t.Errorf("Require = %q, want %q", got, tc.want)
			}
			check := func(what, got, want string) {
				if want == "" && got != "" {
					t.Errorf("unexpected %s: %s", what, got)
				}
				if want != "" && !strings.Contains(got, want) {
					t.Errorf("%s = %q, want it to contain %q", what, got, want)
				}
			}
			check("Fatalf", f.fatal, tc.fatal)
			check("Skipf", f.skip, tc.sk)
		})
	}
}

func TestParseServers(t *testing.T) {
	got, err := ParseServers("")
	if err != nil || strings.Join(got, ",") != "postgres,pubsub,sqs,pulsar" {
		t.Fatalf("ParseServers(\"\") = %v, %v", got, err)
	}
	got, err = ParseServers(" pulsar, postgres,pulsar ")
	if err != nil || strings.Join(got, ",") != "pulsar,postgres" {
		t.Fatalf("ParseServers = %v, %v", got, err)
	}
	if _, err := ParseServers("postgres,kafka"); err == nil {
		t.Fatal("ParseServers accepted kafka")
	}
}

func TestSettingsEnviron(t *testing.T) {
	s := Settings{PostgresURL: "postgres://p", PulsarURL: "pulsar://q"}
	got := strings.Join(s.Environ(), " ")
	if got != EnvPostgresURL+"=postgres://p "+EnvPulsarURL+"=pulsar://q" {
		t.Fatalf("Environ = %s", got)
	}
}
