package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/fence"
)

// exampleLock starts an in-process etcd and takes the lock name; in your
// code, connect to your own etcd.
func exampleLock(name string) (hold etcdlock.Hold, stop func()) {
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	client, err := srv.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	s, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(context.Background()); err != nil {
		log.Fatal(err)
	}
	hold, _ = m.Held()
	return hold, func() {
		_ = m.UnlockContext(context.Background())
		_ = s.Close()
		srv.Close()
	}
}

// A write to a database goes with the fence of the hold it was made under:
// it commits only if no later holder of the lock has written since. Here
// SQLite (modernc.org/sqlite); PostgreSQL needs Table{Dollar: true}.
func ExampleTable_Do() {
	hold, stop := exampleLock("accounts")
	defer stop()

	dir, err := os.MkdirTemp("", "fence")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	var table fence.Table // etcdlock_fence
	if err := table.Create(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE balance (account TEXT PRIMARY KEY, amount INTEGER)"); err != nil {
		log.Fatal(err)
	}

	f := hold.Fence()
	err = table.Do(ctx, db, f, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO balance VALUES ('alice', 100)")
		return err
	})
	fmt.Println("the holder's write:", err)

	// A holder of an older token, one that was paused while the lock
	// passed on, is refused, and its write does not commit.
	old := f
	old.Token--
	err = table.Do(ctx, db, old, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE balance SET amount = 0")
		return err
	})
	fmt.Println("an older token's write refused:", errors.Is(err, fence.ErrStale))
	var amount int
	if err := db.QueryRow("SELECT amount FROM balance WHERE account = 'alice'").Scan(&amount); err != nil {
		log.Fatal(err)
	}
	fmt.Println("amount:", amount)
	// Output:
	// the holder's write: <nil>
	// an older token's write refused: true
	// amount: 100
}

// A service guards its writes with Handler; its clients send the fence of
// their hold with Transport.
func ExampleHandler() {
	hold, stop := exampleLock("orders")
	defer stop()

	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := fence.FromContext(r.Context())
		fmt.Fprintf(w, "written under token %d", f.Token)
	})
	srv := httptest.NewServer(&fence.Handler{Store: &fence.Memory{}, Lock: "orders", Next: write})
	defer srv.Close()

	client := &http.Client{Transport: &fence.Transport{}}
	post := func(f etcdlock.Fence) {
		ctx := fence.NewContext(context.Background(), f)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			log.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, strings.Contains(string(body), "written"), strings.Contains(string(body), "stale"))
	}
	f := hold.Fence()
	post(f)
	old := f
	old.Token--
	post(old) // a holder that lost the lock to f's
	// Output:
	// 200 true false
	// 409 false true
}
