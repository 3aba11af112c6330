package fence_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/etcdlock/etcdlock/fence"
)

// The tests' databases: SQLite always (a file of the test's own), and
// PostgreSQL when FENCE_POSTGRES holds a connection string of one
// (scripts/postgres.sh starts one and prints it).

// postgresEnv names the PostgreSQL of the tests.
const postgresEnv = "FENCE_POSTGRES"

// A testDB is one database of the tests, with the Table to use in it.
type testDB struct {
	name   string // sqlite or postgres
	db     *sql.DB
	table  fence.Table
	schema string // the test's own schema, with a dot; "" on SQLite
}

// arg is the n-th placeholder in d's SQL.
func (d testDB) arg(n int) string {
	if d.table.Dollar {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// sqliteDB opens a new SQLite database in a file of the test's own: with a
// busy timeout, so that a writer waits for another instead of failing, and
// WAL, so that readers do not wait for writers.
func sqliteDB(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// schemaSeq makes the PostgreSQL schemas of the tests' own.
var schemaSeq atomic.Int64

// databases returns the tests' databases, each with a fence table of the
// test's own, created; PostgreSQL's absence is logged.
func databases(t *testing.T) []testDB {
	t.Helper()
	dbs := []testDB{{name: "sqlite", db: sqliteDB(t)}}
	if dsn := os.Getenv(postgresEnv); dsn != "" {
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			t.Fatalf("%s: %v", postgresEnv, err)
		}
		t.Cleanup(func() { _ = db.Close() })
		schema := fmt.Sprintf("fence_test_%d_%d", os.Getpid(), schemaSeq.Add(1))
		if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
			t.Fatalf("%s: %v", postgresEnv, err)
		}
		t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE") })
		dbs = append(dbs, testDB{name: "postgres", db: db, table: fence.Table{Name: schema + "." + fence.DefaultTable, Dollar: true}, schema: schema + "."})
	} else {
		t.Logf("PostgreSQL not tested: %s is not set (scripts/postgres.sh starts one)", postgresEnv)
	}
	for _, d := range dbs {
		if err := d.table.Create(t.Context(), d.db); err != nil {
			t.Fatalf("%s: create: %v", d.name, err)
		}
	}
	return dbs
}
