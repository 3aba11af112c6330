package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/fence"
)

// fenceOf returns a fence of the lock name with token, as a Mutex hold of
// the lease 0x1f would give.
func fenceOf(name string, token int64) etcdlock.Fence {
	return etcdlock.Fence{Name: name, Key: name + "/1f", Token: token}
}

// writeRow is work that writes the row (token) into d's table data.
func writeRow(d testDB, token int64) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+d.schema+"data (token) VALUES ("+d.arg(1)+")", token)
		return err
	}
}

// rows returns the tokens in d's table data, in the order written.
func rows(t *testing.T, d testDB) []int64 {
	t.Helper()
	r, err := d.db.QueryContext(t.Context(), "SELECT token FROM "+d.schema+"data ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var tokens []int64
	for r.Next() {
		var tok int64
		if err := r.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return tokens
}

// createData makes d's table data: an id in the order of commits, and the
// token of each write.
func createData(t *testing.T, d testDB) {
	t.Helper()
	id := "INTEGER PRIMARY KEY AUTOINCREMENT"
	if d.name == "postgres" {
		id = "BIGSERIAL PRIMARY KEY"
	}
	if _, err := d.db.ExecContext(t.Context(), "CREATE TABLE "+d.schema+"data (id "+id+", token BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

// A write is admitted with its token only if no higher token was, in the
// transaction that makes it: a stale one is refused and leaves nothing; a
// failed one leaves nothing either.
func TestTableAdmit(t *testing.T) {
	t.Parallel()
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			createData(t, d)
			if err := d.table.Create(ctx, d.db); err != nil {
				t.Fatalf("Create again: got %v, want nil", err)
			}
			highest := func(name string, want int64) {
				t.Helper()
				got, err := d.table.Highest(ctx, d.db, name)
				if err != nil || got != want {
					t.Fatalf("Highest(%s): got %d, %v, want %d", name, got, err, want)
				}
			}
			do := func(f etcdlock.Fence, want error) {
				t.Helper()
				if err := d.table.Do(ctx, d.db, f, writeRow(d, f.Token)); !errors.Is(err, want) {
					t.Fatalf("Do(token %d of %s): got %v, want %v", f.Token, f.Name, err, want)
				}
			}
			highest("orders", 0)
			do(fenceOf("orders", 10), nil) // the first write of the lock
			do(fenceOf("orders", 10), nil) // its holder writes again
			do(fenceOf("orders", 12), nil) // the next holder
			highest("orders", 12)
			do(fenceOf("orders", 11), fence.ErrStale) // a holder that lost the lock to 12
			do(fenceOf("orders", 10), fence.ErrStale)
			do(fenceOf("invoices", 5), nil) // another lock has its own highest
			highest("orders", 12)
			highest("invoices", 5)

			// A write that fails takes its admission with it.
			boom := errors.New("boom")
			err := d.table.Do(ctx, d.db, fenceOf("orders", 13), func(ctx context.Context, tx *sql.Tx) error {
				if err := writeRow(d, 13)(ctx, tx); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("Do with failing work: got %v, want boom", err)
			}
			highest("orders", 12)

			// Admit in a transaction of the caller's own.
			tx, err := d.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.table.Admit(ctx, tx, fenceOf("orders", 9)); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("Admit(stale): got %v, want ErrStale", err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if got, want := rows(t, d), []int64{10, 10, 12, 5}; !slices.Equal(got, want) {
				t.Fatalf("rows written: got %v, want %v", got, want)
			}
			var writes int64
			if err := d.db.QueryRowContext(ctx, "SELECT writes FROM "+d.schema+fence.DefaultTable+" WHERE lock_name = "+d.arg(1), "orders").Scan(&writes); err != nil || writes != 3 {
				t.Fatalf("writes of orders: got %d, %v, want 3", writes, err)
			}
		})
	}
}

// Writers of one lock race, each with the token it was given when it
// (would have) locked, at random moments: whatever order they arrive in,
// the writes that commit are in token order, and every refused one was
// stale when it arrived.
func TestTableConcurrent(t *testing.T) {
	t.Parallel()
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			createData(t, d)
			const writers, each = 8, 12
			var next, accepted, refused atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for range writers {
				wg.Go(func() {
					for range each {
						tok := next.Add(1)
						time.Sleep(rand.N(3 * time.Millisecond)) // a pause after its lock
						err := d.table.Do(ctx, d.db, fenceOf("orders", tok), writeRow(d, tok))
						switch {
						case err == nil:
							accepted.Add(1)
						case errors.Is(err, fence.ErrStale):
							// Stale when refused: a higher token was
							// admitted, so the highest is above it now.
							if h, err := d.table.Highest(ctx, d.db, "orders"); err != nil || h <= tok {
								errs <- fmt.Errorf("token %d refused as stale, the highest is %d (%v)", tok, h, err)
								return
							}
							refused.Add(1)
						default:
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := rows(t, d)
			for i := 1; i < len(got); i++ {
				if got[i] < got[i-1] {
					t.Fatalf("write %d: token %d committed after %d: %v", i, got[i], got[i-1], got)
				}
			}
			if int64(len(got)) != accepted.Load() || accepted.Load()+refused.Load() != writers*each {
				t.Fatalf("got %d rows, %d accepted, %d refused, want rows = accepted and %d in all", len(got), accepted.Load(), refused.Load(), writers*each)
			}
			t.Logf("%s: %d writes committed in token order, %d stale refused", d.name, accepted.Load(), refused.Load())
		})
	}
}

// First writes of new locks race, several with one token (a holder that
// retries, or two requests of one hold): every one is admitted, on every
// database, whatever the order of the inserts.
func TestTableFirstWrites(t *testing.T) {
	t.Parallel()
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			const locks, writers = 50, 4
			var wg sync.WaitGroup
			errs := make(chan error, locks*writers)
			for i := range locks {
				f := fenceOf(fmt.Sprintf("lock%d", i), 10)
				for range writers {
					wg.Go(func() {
						if err := d.table.Do(ctx, d.db, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
							errs <- fmt.Errorf("%s: %w", f.Name, err)
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			n := 0
			for err := range errs {
				if n++; n <= 3 {
					t.Error(err)
				}
			}
			if n > 0 {
				t.Fatalf("%d of %d first writes with the token of the lock's only holder failed, want none", n, locks*writers)
			}
		})
	}
}

// Bad input is an error that changes nothing.
func TestTableBadInput(t *testing.T) {
	t.Parallel()
	d := databases(t)[0]
	ctx := t.Context()
	for _, f := range []etcdlock.Fence{{}, {Name: "orders", Key: "orders/1f"}, {Name: "orders", Key: "other/1f", Token: 3}} {
		if err := d.table.Do(ctx, d.db, f, writeRow(d, 1)); !errors.Is(err, etcdlock.ErrInvalidFence) {
			t.Errorf("Do(%+v): got %v, want ErrInvalidFence", f, err)
		}
		if err := (&fence.Memory{}).Do(ctx, f, func(context.Context) error { return nil }); !errors.Is(err, etcdlock.ErrInvalidFence) {
			t.Errorf("Memory.Do(%+v): got %v, want ErrInvalidFence", f, err)
		}
	}
	if err := d.table.Do(ctx, nil, fenceOf("orders", 1), writeRow(d, 1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do(nil db): got %v, want ErrInvalidArgument", err)
	}
	if err := d.table.Admit(ctx, nil, fenceOf("orders", 1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Admit(nil tx): got %v, want ErrInvalidArgument", err)
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if err := d.table.Do(nil, d.db, fenceOf("orders", 1), writeRow(d, 1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do(nil ctx): got %v, want ErrInvalidArgument", err)
	}
	if err := d.table.Do(ctx, d.db, fenceOf("orders", 1), nil); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do(nil work): got %v, want ErrInvalidArgument", err)
	}
	long := strings.Repeat("n", 256)
	if err := d.table.Do(ctx, d.db, fenceOf(long, 1), writeRow(d, 1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do(a 256-byte lock name): got %v, want ErrInvalidArgument", err)
	}
	if err := d.table.Create(ctx, nil); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Create(nil db): got %v, want ErrInvalidArgument", err)
	}
	if _, err := d.table.Highest(ctx, nil, "orders"); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Highest(nil db): got %v, want ErrInvalidArgument", err)
	}
	var nilMemory *fence.Memory
	if err := nilMemory.Do(ctx, fenceOf("orders", 1), func(context.Context) error { return nil }); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("a nil Memory's Do: got %v, want ErrInvalidArgument", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	ran := false
	if err := (&fence.Memory{}).Do(cancelled, fenceOf("orders", 1), func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("Memory.Do on a cancelled context: got %v, work ran %v; want context.Canceled, not run", err, ran)
	}
	// work that panics leaves no transaction open: the next write of the
	// lock goes through.
	func() {
		defer func() { _ = recover() }()
		_ = d.table.Do(ctx, d.db, fenceOf("orders", 2), func(context.Context, *sql.Tx) error { panic("boom") })
	}()
	if err := d.table.Do(ctx, d.db, fenceOf("orders", 3), func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Errorf("Do after a panicking work: got %v, want nil", err)
	}
	if h, err := d.table.Highest(ctx, d.db, "orders"); err != nil || h != 3 {
		t.Errorf("Highest after a panicking work of 2 and a write of 3: got %d, %v, want 3", h, err)
	}
	bad := fence.Table{Name: "fence; DROP TABLE etcdlock_fence"}
	if err := bad.Create(ctx, d.db); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Create with table name %q: got %v, want ErrInvalidArgument", bad.Name, err)
	}
	if err := bad.Do(ctx, d.db, fenceOf("orders", 1), writeRow(d, 1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do with table name %q: got %v, want ErrInvalidArgument", bad.Name, err)
	}
	if h, err := d.table.Highest(ctx, d.db, long); err != nil || h != 0 {
		t.Errorf("Highest of the long name after bad input: got %d, %v, want 0, nil", h, err)
	}
}
