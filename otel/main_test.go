package etcdlockotel_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock/etcdtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(etcdtest.Main(m))
}
