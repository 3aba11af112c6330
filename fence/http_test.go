package fence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/fence"
)

// recorder is a handler behind fence.Handler: it records the tokens of the
// requests it served, and how many it served at once at most.
type recorder struct {
	mu      sync.Mutex
	tokens  []int64
	running atomic.Int64
	most    atomic.Int64
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := rec.running.Add(1)
	defer rec.running.Add(-1)
	for m := rec.most.Load(); n > m && !rec.most.CompareAndSwap(m, n); m = rec.most.Load() {
	}
	f, ok := fence.FromContext(r.Context())
	if !ok {
		http.Error(w, "no fence in the context", http.StatusInternalServerError)
		return
	}
	time.Sleep(time.Millisecond)
	rec.mu.Lock()
	rec.tokens = append(rec.tokens, f.Token)
	rec.mu.Unlock()
	w.Header().Set("X-Written", fmt.Sprint(f.Token))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "written with token %d", f.Token)
}

func (rec *recorder) served() []int64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]int64(nil), rec.tokens...)
}

// send sends a request with the header value (none if "") and returns the
// status and body.
func send(t *testing.T, url, header string) (int, string, http.Header) {
	t.Helper()
	status, body, h, err := post(t.Context(), url, header)
	if err != nil {
		t.Fatal(err)
	}
	return status, body, h
}

// post is send for any goroutine: it returns its error.
func post(ctx context.Context, url, header string) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		return 0, "", nil, err
	}
	if header != "" {
		req.Header.Set(fence.Header, header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header, err
}

// The Handler refuses, with its status and reason, a request with no fence,
// a malformed one, one of another lock and a stale one, before its handler
// runs; it passes the others, with the handler's response.
func TestHandlerRefuses(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(&fence.Handler{Store: &fence.Memory{}, Lock: "orders", Next: rec})
	defer srv.Close()

	for _, tc := range []struct {
		header string
		status int
		says   string
	}{
		{"", http.StatusPreconditionRequired, "no Etcdlock-Fence header"},
		{"1042", http.StatusBadRequest, "invalid fence"},
		{"etcdlock:x:orders:1f", http.StatusBadRequest, "not a positive decimal"},
		{fenceOf("invoices", 50).String(), http.StatusForbidden, `a fence of lock "invoices"`},
		{fenceOf("orders", 10).String(), http.StatusCreated, "written with token 10"},
		{fenceOf("orders", 10).String(), http.StatusCreated, "written with token 10"},
		{fenceOf("orders", 12).String(), http.StatusCreated, "written with token 12"},
		{fenceOf("orders", 11).String(), http.StatusConflict, "stale token"},
	} {
		status, body, h := send(t, srv.URL, tc.header)
		if status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("header %q: got %d %q, want %d saying %q", tc.header, status, body, tc.status, tc.says)
		}
		if status == http.StatusCreated && h.Get("X-Written") == "" {
			t.Errorf("header %q: the handler's header is missing", tc.header)
		}
	}
	if got := rec.served(); fmt.Sprint(got) != "[10 10 12]" {
		t.Fatalf("the handler served tokens %v, want [10 10 12]", got)
	}

	bare := httptest.NewServer(&fence.Handler{Next: rec})
	defer bare.Close()
	if status, _, _ := send(t, bare.URL, fenceOf("orders", 13).String()); status != http.StatusInternalServerError {
		t.Fatalf("a Handler without a Store: got %d, want 500", status)
	}
}

// failingStore runs the work and then fails, as a commit refused would.
type failingStore struct{}

func (failingStore) Do(ctx context.Context, f etcdlock.Fence, work func(ctx context.Context) error) error {
	if err := work(ctx); err != nil {
		return err
	}
	return errors.New("commit refused")
}

// A response whose write did not commit is not sent: the client gets 503.
func TestHandlerWithholdsUncommitted(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(&fence.Handler{Store: failingStore{}, Next: rec})
	defer srv.Close()
	status, body, h := send(t, srv.URL, fenceOf("orders", 3).String())
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "commit refused") || h.Get("X-Written") != "" {
		t.Fatalf("got %d %q (X-Written %q), want 503 saying commit refused, without the handler's header", status, body, h.Get("X-Written"))
	}
}

// A handler that answers with an error status has its writes rolled back,
// and the admission of its token with them; its response is sent as it is.
func TestHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	db := sqliteDB(t)
	table := fence.Table{}
	if err := table.Create(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE notes (token BIGINT)"); err != nil {
		t.Fatal(err)
	}
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := fence.TxFrom(r.Context())
		f, _ := fence.FromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO notes VALUES (?)", f.Token); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Has("fail") {
			http.Error(w, "invalid note", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(&fence.Handler{Store: fence.SQLStore{DB: db}, Next: write})
	defer srv.Close()
	if status, _, _ := send(t, srv.URL, fenceOf("orders", 5).String()); status != http.StatusCreated {
		t.Fatalf("a write: got %d, want 201", status)
	}
	if status, body, _ := send(t, srv.URL+"?fail", fenceOf("orders", 9).String()); status != http.StatusUnprocessableEntity || !strings.Contains(body, "invalid note") {
		t.Fatalf("a write its handler refuses: got %d %q, want 422 invalid note", status, body)
	}
	var notes int
	if err := db.QueryRow("SELECT COUNT(*) FROM notes").Scan(&notes); err != nil || notes != 1 {
		t.Fatalf("notes: got %d, %v, want 1 (the refused write rolled back)", notes, err)
	}
	if h, err := table.Highest(t.Context(), db, "orders"); err != nil || h != 5 {
		t.Fatalf("highest: got %d, %v, want 5 (the refused write's admission rolled back)", h, err)
	}
}

// A fence the Store cannot take (a lock name longer than SQLStore's table
// holds) is 400, not a 503 that a client would retry; nothing is admitted.
func TestHandlerFenceTooLong(t *testing.T) {
	t.Parallel()
	db := sqliteDB(t)
	table := fence.Table{}
	if err := table.Create(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(&fence.Handler{Store: fence.SQLStore{DB: db}, Next: rec})
	defer srv.Close()
	name := strings.Repeat("n", 300)
	if status, body, _ := send(t, srv.URL, fenceOf(name, 5).String()); status != http.StatusBadRequest || !strings.Contains(body, "at most") {
		t.Fatalf("a fence of a %d-byte lock name: got %d %q, want 400", len(name), status, body)
	}
	if got := rec.served(); len(got) != 0 {
		t.Fatalf("the handler served %v, want nothing", got)
	}
}

// Memory admits a token whatever its work does: work that failed may have
// written part of its change, which an older holder must not write over.
func TestMemoryKeepsTokenOfFailedWork(t *testing.T) {
	t.Parallel()
	var m fence.Memory
	if err := m.Do(t.Context(), fenceOf("orders", 9), func(context.Context) error { return errors.New("half written") }); err == nil {
		t.Fatal("the work's error was not returned")
	}
	if h := m.Highest("orders"); h != 9 {
		t.Fatalf("highest after failed work: got %d, want 9", h)
	}
	if err := m.Do(t.Context(), fenceOf("orders", 5), func(context.Context) error { return nil }); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("an older token after the failed work: got %v, want ErrStale", err)
	}
}

// Requests of one lock race, each with the token of its turn: the handler
// serves one at a time, in token order, and refuses the stale ones.
func TestHandlerConcurrent(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(&fence.Handler{Store: &fence.Memory{}, Next: rec})
	defer srv.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 10 {
				status, body, _, err := post(t.Context(), srv.URL, fenceOf("orders", next.Add(1)).String())
				if err != nil {
					t.Error(err)
					return
				}
				switch status {
				case http.StatusCreated:
				case http.StatusConflict:
					refused.Add(1)
				default:
					t.Errorf("got %d %q, want 201 or 409", status, body)
				}
			}
		})
	}
	wg.Wait()
	got := rec.served()
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("served token %d after %d: %v", got[i], got[i-1], got)
		}
	}
	if most := rec.most.Load(); most != 1 {
		t.Fatalf("the handler ran %d requests of one lock at once, want 1", most)
	}
	if len(got)+int(refused.Load()) != 80 {
		t.Fatalf("%d served + %d refused, want 80", len(got), refused.Load())
	}
}

// Transport adds the fence of the request's context, from NewContext or a
// Do scope, and changes nothing else.
func TestTransport(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Get(fence.Header) }))
	defer srv.Close()
	client := &http.Client{Transport: &fence.Transport{}}
	get := func(ctx context.Context, own string) string {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if own != "" {
			req.Header.Set(fence.Header, own)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if req.Header.Get(fence.Header) != own {
			t.Fatalf("the caller's request was changed: header %q", req.Header.Get(fence.Header))
		}
		return <-seen
	}
	f := fenceOf("orders", 7)
	if got := get(context.Background(), ""); got != "" {
		t.Errorf("no fence: the server got %q, want none", got)
	}
	if got := get(fence.NewContext(context.Background(), f), ""); got != f.String() {
		t.Errorf("NewContext: the server got %q, want %q", got, f.String())
	}
	if got := get(fence.NewContext(context.Background(), f), "mine"); got != "mine" {
		t.Errorf("a header of the caller's own: the server got %q, want it kept", got)
	}
	// A fence that names no hold is not sent: its text would read as
	// another fence.
	bad := etcdlock.Fence{Name: "a", Key: "write/9", Token: 3}
	req, err := http.NewRequestWithContext(fence.NewContext(context.Background(), bad), http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := client.Do(req); !errors.Is(err, etcdlock.ErrInvalidFence) {
		if err == nil {
			resp.Body.Close()
			<-seen
		}
		t.Errorf("an invalid fence: got %v, want ErrInvalidFence and nothing sent", err)
	}

	etcd := etcdtest.Start(t)
	s, err := etcdlock.NewSession(etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = etcdlock.NewMutex(s, "orders").Do(t.Context(), func(ctx context.Context) error {
		h, _ := etcdlock.HoldFrom(ctx)
		if got := get(ctx, ""); got != h.Fence().String() || got == "" {
			return fmt.Errorf("a Do scope: the server got %q, want %q", got, h.Fence().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The worst day: a holder paused past its TTL sends its write after the next
// holder wrote. Its fence is stale and refused, on one server with Memory
// and on two with an SQLStore of one database; the next holder's passes.
func TestHandlerStaleAfterPause(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	db := sqliteDB(t)
	table := fence.Table{}
	if err := table.Create(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	mem := httptest.NewServer(&fence.Handler{Store: &fence.Memory{}, Lock: "orders", Next: rec})
	defer mem.Close()
	var sqlServers []*httptest.Server
	for range 2 { // two processes, one database
		srv := httptest.NewServer(&fence.Handler{Store: fence.SQLStore{DB: db}, Lock: "orders", Next: rec})
		defer srv.Close()
		sqlServers = append(sqlServers, srv)
	}
	client := &http.Client{Transport: &fence.Transport{}}
	post := func(ctx context.Context, url string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	ctx := t.Context()
	cliA, proxy := etcd.ProxiedClient(t)
	a, err := etcdlock.NewSession(cliA, etcdlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := etcdlock.NewSession(etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ma, mb := etcdlock.NewMutex(a, "orders"), etcdlock.NewMutex(b, "orders")
	if err := ma.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	ha, _ := ma.Held()
	ctxA := fence.NewContext(ctx, ha.Fence())
	if got := post(ctxA, mem.URL); got != http.StatusCreated {
		t.Fatalf("the holder's write: got %d, want 201", got)
	}

	// A stops with its keep-alives until B holds: its lease expires.
	proxy.PauseWhile(func() {
		if err := mb.LockContext(ctx); err != nil {
			t.Errorf("the next holder: %v", err)
		}
	})
	if t.Failed() {
		return
	}
	hb, _ := mb.Held()
	ctxB := fence.NewContext(ctx, hb.Fence())
	for _, url := range []string{mem.URL, sqlServers[0].URL} {
		if got := post(ctxB, url); got != http.StatusCreated {
			t.Fatalf("the next holder's write: got %d, want 201", got)
		}
	}
	// A goes on as if it still held the lock.
	for i, url := range []string{mem.URL, sqlServers[0].URL, sqlServers[1].URL} {
		if got := post(ctxA, url); got != http.StatusConflict {
			t.Fatalf("server %d: the paused holder's write: got %d, want 409", i, got)
		}
	}
	if err := etcdlock.CheckFence(ctx, etcd.Client(t), ha.Fence()); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("CheckFence of the paused holder's fence: got %v, want ErrLockLost", err)
	}
	if got, want := fmt.Sprint(rec.served()), fmt.Sprint([]int64{ha.Token, hb.Token, hb.Token}); got != want {
		t.Fatalf("served tokens %s, want %s", got, want)
	}
	if h, err := table.Highest(ctx, db, "orders"); err != nil || h != hb.Token {
		t.Fatalf("the table's highest token: got %d, %v, want %d", h, err, hb.Token)
	}
	if err := mb.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}
