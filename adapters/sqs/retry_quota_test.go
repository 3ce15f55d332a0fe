package sqs_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder/adapters/sqs"
)

// TestURLClientHasNoRetryQuota checks that the client the sqs:// opener
// builds retries every failed call its full number of attempts however many
// failed recently. The SDK's default retryer draws each retry from a
// client-wide token bucket and, once it is empty, fails calls at their
// first attempt ("retry quota exceeded"): under a burst of connection
// resets (ElasticMQ under load) that turned into publish failures, while
// the portable layer already bounds retries itself. The endpoint here
// answers every request with a 500, which the SDK retries; 80 calls with
// 3 attempts each need 160 retries, beyond the default bucket's 100.
func TestURLClientHasNoRetryQuota(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"__type":"InternalFailure","message":"try again"}`))
	}))
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_RETRY_MODE", "")
	t.Setenv("AWS_MAX_ATTEMPTS", "")
	u, err := url.Parse("sqs://q.fifo?region=us-east-1&endpoint=" + url.QueryEscape(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := sqs.URLClient(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	const calls, attempts = 80, 3
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			_, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String("q.fifo")})
			if err == nil {
				t.Error("GetQueueUrl succeeded against an endpoint that always fails")
			}
		})
	}
	wg.Wait()
	if got := requests.Load(); got != calls*attempts {
		t.Fatalf("the endpoint saw %d requests for %d calls; want %d (%d attempts each): calls were cut short by a client-side retry quota", got, calls, calls*attempts, attempts)
	}
}
