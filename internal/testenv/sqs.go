package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartSQS starts ElasticMQ (org.elasticmq:elasticmq-server_2.13, resolved with
// Maven from integration/java/elasticmq/pom.xml) on 127.0.0.1 on a free port,
// configured by integration/java/elasticmq/elasticmq.conf, and waits until it
// answers an SQS ListQueues call (AWS JSON 1.0).
func StartSQS(ctx context.Context, o Options) (*Server, error) {
	java, cp, resolved, err := javaClasspath(ctx, &o, "elasticmq")
	if err != nil {
		return nil, fmt.Errorf("sqs: %w", err)
	}
	dir := filepath.Join(o.Dir, SQS)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(o.RepoRoot, javaDir, "elasticmq", "elasticmq.conf")
	return startWithRetry(ctx, &o, SQS, 3, func(int) (*Server, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		port := strconv.Itoa(ports[0])
		began := time.Now()
		cmd := exec.Command(java,
			"-XX:+UseSerialGC", "-Xmx512m", "-XX:-UsePerfData",
			"-Dconfig.file="+conf,
			"-Dnode-address.port="+port,
			"-Drest-sqs.bind-port="+port,
			"-cp", cp,
			"org.elasticmq.server.Main",
		)
		cmd.Dir = dir
		p, err := startProc(SQS, cmd, filepath.Join(dir, "elasticmq.log"), syscall.SIGTERM, 15*time.Second)
		if err != nil {
			return nil, err
		}
		endpoint := "http://127.0.0.1:" + port
		ready := func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/", strings.NewReader("{}"))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/x-amz-json-1.0")
			req.Header.Set("X-Amz-Target", "AmazonSQS.ListQueues")
			_, err = httpDo(req)
			return err
		}
		if err := p.waitReady(ctx, o.startTimeout(90*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		return &Server{
			Name:            SQS,
			Settings:        Settings{SQSEndpoint: endpoint},
			StartDuration:   time.Since(began),
			ResolveDuration: resolved,
			proc:            p,
		}, nil
	})
}

func resolveTimeout(o *Options) time.Duration {
	if o.ResolveTimeout > 0 {
		return o.ResolveTimeout
	}
	return 20 * time.Minute
}
