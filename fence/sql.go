package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/etcdlock/etcdlock"
)

// DefaultTable is the name of the fence table when Table.Name is empty.
const DefaultTable = "etcdlock_fence"

// Table is a table of the highest fencing token per lock, in a database
// reached through database/sql, and the statements that read and write it.
// Its three columns:
//
//	lock_name VARCHAR(255) NOT NULL PRIMARY KEY -- the lock's name (at most 255 bytes)
//	token     BIGINT NOT NULL                   -- the highest token accepted
//	writes    BIGINT NOT NULL                   -- how many writes it admitted
//
// Create makes it. Admit admits a write in the transaction that makes it:
// the write and the new highest token commit together, or neither does.
// The statements are the same on PostgreSQL (with Dollar set), MySQL and
// SQLite; the package's tests run them on SQLite (modernc.org/sqlite), and
// on PostgreSQL when the environment variable FENCE_POSTGRES names one.
// MySQL is not tested: there, concurrent first writes of lock names that
// share an index gap can deadlock (InnoDB's gap locks), which the caller
// sees as an error to retry.
type Table struct {
	Name   string // the table's name, DefaultTable if empty; letters, digits, _ and . only
	Dollar bool   // placeholders $1, $2, … (PostgreSQL) instead of ? (MySQL, SQLite)
}

// maxName is the longest lock name the table holds: its column is
// VARCHAR(255), which some databases would cut silently.
const maxName = 255

// tableName matches the table names Table accepts: they go into statements
// as they are.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// Execer is what Create needs: a *sql.DB, *sql.Conn or *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Create makes the table if it does not exist. Its statement, on
// PostgreSQL, MySQL and SQLite:
//
//	CREATE TABLE IF NOT EXISTS etcdlock_fence (lock_name VARCHAR(255) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, writes BIGINT NOT NULL)
func (t Table) Create(ctx context.Context, db Execer) error {
	if ctx == nil || db == nil {
		return fmt.Errorf("%w: nil context or database", etcdlock.ErrInvalidArgument)
	}
	name, err := t.name()
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+name+" (lock_name VARCHAR(255) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, writes BIGINT NOT NULL)")
	if err != nil {
		return fmt.Errorf("fence: create table %s: %w", name, err)
	}
	return nil
}

// Admit admits a write of f's holder in tx, the transaction that makes the
// write: nil if f's token is not lower than the highest accepted for its
// lock, which it then becomes, in tx; an error wrapping ErrStale if it is
// lower (roll tx back: its write must not commit). One statement does it,
// and locks the lock's row until tx ends, so that a concurrent transaction
// of another token waits for tx and then sees its token:
//
//	UPDATE etcdlock_fence SET token = ?, writes = writes + 1 WHERE lock_name = ? AND token <= ?
//
// When the UPDATE changes no row, Admit reads the row (SELECT token): a
// higher token is ErrStale; no row is the lock's first write, which Admit
// inserts (INSERT, under a SAVEPOINT: when another first write inserted it
// meanwhile, Admit undoes its own and updates that row, as above); a row
// that another transaction wrote after the UPDATE looked makes it UPDATE
// again, a few times at most. Any error leaves tx to its caller, who rolls
// it back; on PostgreSQL, an error aborts tx. An invalid f, or a lock name
// longer than the column's 255 bytes, is an error wrapping
// etcdlock.ErrInvalidFence or etcdlock.ErrInvalidArgument, and nothing is
// run.
func (t Table) Admit(ctx context.Context, tx *sql.Tx, f etcdlock.Fence) error {
	if err := valid(ctx, f); err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", etcdlock.ErrInvalidArgument)
	}
	if len(f.Name) > maxName {
		return fmt.Errorf("%w: lock name of %d bytes: the fence table holds at most %d", etcdlock.ErrInvalidArgument, len(f.Name), maxName)
	}
	name, err := t.name()
	if err != nil {
		return err
	}
	// A row that another transaction made or moved after this one's UPDATE
	// looked can show in the SELECT after it (PostgreSQL's READ COMMITTED
	// takes a snapshot per statement): then the UPDATE runs again, and now
	// finds it. Tries bounds that.
	for try := 1; ; try++ {
		ok, err := t.update(ctx, tx, name, f)
		if err != nil || ok {
			return err
		}
		var highest int64
		err = tx.QueryRowContext(ctx, t.placeholders("SELECT token FROM "+name+" WHERE lock_name = ?"), f.Name).Scan(&highest)
		switch {
		case err == nil && highest > f.Token:
			return stale(f, highest)
		case err == nil:
			if try == admitTries {
				return fmt.Errorf("fence: admit token %d of lock %q: its row moved %d times under the UPDATE: retry the transaction", f.Token, f.Name, try)
			}
			continue
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("fence: admit token %d of lock %q: %w", f.Token, f.Name, err)
		}
		// The lock's first write. Another may insert the row meanwhile: the
		// savepoint undoes the failed insert, and the update then finds the
		// row (and waits for its writer's transaction).
		if _, err := tx.ExecContext(ctx, "SAVEPOINT etcdlock_fence_insert"); err != nil {
			return wrapFirst(f, err)
		}
		_, err = tx.ExecContext(ctx, t.placeholders("INSERT INTO "+name+" (lock_name, token, writes) VALUES (?, ?, 1)"), f.Name, f.Token)
		if err == nil {
			_, err = tx.ExecContext(ctx, "RELEASE SAVEPOINT etcdlock_fence_insert")
			return wrapFirst(f, err)
		}
		if try == admitTries {
			return wrapFirst(f, err)
		}
		if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT etcdlock_fence_insert"); rerr != nil {
			return wrapFirst(f, errors.Join(err, rerr))
		}
	}
}

// admitTries bounds the UPDATEs of one Admit: a row that moves under it
// each time is a write of another transaction each time.
const admitTries = 4

// update runs the UPDATE of Admit: true if it admitted f.
func (t Table) update(ctx context.Context, tx *sql.Tx, name string, f etcdlock.Fence) (bool, error) {
	res, err := tx.ExecContext(ctx, t.placeholders("UPDATE "+name+" SET token = ?, writes = writes + 1 WHERE lock_name = ? AND token <= ?"), f.Token, f.Name, f.Token)
	if err != nil {
		return false, fmt.Errorf("fence: admit token %d of lock %q: %w", f.Token, f.Name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("fence: admit token %d of lock %q: %w", f.Token, f.Name, err)
	}
	return n == 1, nil
}

// wrapFirst wraps the error, if any, of the first write of f's lock.
func wrapFirst(f etcdlock.Fence, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("fence: admit the first token of lock %q: %w", f.Name, err)
}

// Do runs work in a transaction of db in which Admit admitted f, and
// commits it if work returns nil; otherwise it rolls back and returns the
// error (ErrStale, wrapped, for a stale f: work does not run). The rollback
// runs on a context that ctx's end does not cancel.
func (t Table) Do(ctx context.Context, db *sql.DB, f etcdlock.Fence, work func(ctx context.Context, tx *sql.Tx) error) error {
	if err := valid(ctx, f); err != nil {
		return err
	}
	if db == nil || work == nil {
		return fmt.Errorf("%w: nil database or work", etcdlock.ErrInvalidArgument)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fence: begin: %w", err)
	}
	ended := false
	defer func() {
		if !ended {
			_ = rollback(tx) // work panicked: the row lock must not outlive it
		}
	}()
	if err := t.Admit(ctx, tx, f); err != nil {
		ended = true
		return errors.Join(err, rollback(tx))
	}
	if err := work(ctx, tx); err != nil {
		ended = true
		return errors.Join(err, rollback(tx))
	}
	ended = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fence: commit the write of token %d of lock %q: %w", f.Token, f.Name, err)
	}
	return nil
}

// Highest returns the highest token accepted for the lock name, 0 if none.
func (t Table) Highest(ctx context.Context, db *sql.DB, name string) (int64, error) {
	if ctx == nil || db == nil {
		return 0, fmt.Errorf("%w: nil context or database", etcdlock.ErrInvalidArgument)
	}
	table, err := t.name()
	if err != nil {
		return 0, err
	}
	var highest int64
	err = db.QueryRowContext(ctx, t.placeholders("SELECT token FROM "+table+" WHERE lock_name = ?"), name).Scan(&highest)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fence: read the highest token of lock %q: %w", name, err)
	}
	return highest, nil
}

// rollback rolls tx back; database/sql's Rollback takes no context, and
// ends on its own: a transaction whose context ended is rolled back by
// database/sql already (then it returns sql.ErrTxDone, which is no error
// here).
func rollback(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("fence: rollback: %w", err)
	}
	return nil
}

// name returns the table's name, or the error that makes it unusable.
func (t Table) name() (string, error) {
	if t.Name == "" {
		return DefaultTable, nil
	}
	if !tableName.MatchString(t.Name) {
		return "", fmt.Errorf("%w: table name %q: want letters, digits and _, with one optional schema", etcdlock.ErrInvalidArgument, t.Name)
	}
	return t.Name, nil
}

// placeholders writes the ? of query as $1, $2, … when t.Dollar is set.
func (t Table) placeholders(query string) string {
	if !t.Dollar {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// SQLStore is a Store whose highest tokens are in a Table of DB, for several
// processes: its Do runs work in the transaction in which Table.Admit
// admitted the fence (TxFrom gives it to work), and commits both together.
type SQLStore struct {
	DB    *sql.DB // the database of the resource and of Table
	Table Table   // the table of highest tokens, in DB
}

// Do runs work as Store describes, in a transaction of s.DB that work gets
// from TxFrom(ctx); it commits if work returns nil, and rolls back
// otherwise. Work that returns before it is done with the transaction
// (writes from another goroutine afterwards) writes outside the fence.
func (s SQLStore) Do(ctx context.Context, f etcdlock.Fence, work func(ctx context.Context) error) error {
	return s.Table.Do(ctx, s.DB, f, func(ctx context.Context, tx *sql.Tx) error {
		return work(context.WithValue(ctx, txKey{}, tx))
	})
}

// txKey is the context key of SQLStore's transaction.
type txKey struct{}

// TxFrom returns the transaction SQLStore.Do runs work in, for work's
// writes, and false outside of one.
func TxFrom(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}
