package etcdtest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestMain(m *testing.M) {
	testflags.SetParallel(8) // the parallel tests mostly wait for etcd
	goleak.VerifyTestMain(etcdtest.Main(m))
}
