// Command river is the consumer of the "Coming from" pages written with
// River (riverqueue/river), a job queue in PostgreSQL: five balance
// adjustments to two accounts as five jobs, the first attempt of 101
// failing. DATABASE_URL names the database; the program migrates River's
// tables into it.
//
// River runs jobs concurrently and retries a failed one later (after its
// backoff, a second or more): nothing holds acct-42 meanwhile, so 102 and
// 103 are applied before 101. Compare with ../keyorder on postgres://,
// where the retry of 101 runs before anything behind it in its account.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Adjustment is a job: River stores its arguments as JSON.
type Adjustment struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Delta   int    `json:"delta"`
}

func (Adjustment) Kind() string { return "adjustment" }

var adjustments = []Adjustment{
	{"101", "acct-42", -800}, {"102", "acct-42", +500}, {"103", "acct-42", -600},
	{"201", "acct-7", +100}, {"202", "acct-7", -50},
}

// ledger is the worker.
type ledger struct {
	river.WorkerDefaults[Adjustment]
	mu      sync.Mutex
	applied map[string][]string
	failed  bool
	done    chan struct{}
}

func (l *ledger) Work(ctx context.Context, job *river.Job[Adjustment]) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := job.Args
	if a.ID == "101" && !l.failed {
		l.failed = true
		return errors.New("balance service timed out") // retried after River's backoff
	}
	l.applied[a.Account] = append(l.applied[a.Account], a.ID)
	l.applied["all"] = append(l.applied["all"], a.ID)
	if len(l.applied["all"]) == len(adjustments) {
		close(l.done)
	}
	return nil
}

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	drv := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(drv, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatal(err)
	}
	l := &ledger{applied: map[string][]string{}, done: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, l)
	client, err := river.NewClient(drv, &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers: workers,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range adjustments {
		if _, err := client.Insert(ctx, a, nil); err != nil {
			log.Fatal(err)
		}
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-l.done
	if err := client.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", strings.Join(l.applied["all"], " "))
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Println(acct, strings.Join(l.applied[acct], " "))
	}
}
