package fence_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock/etcdtest"
)

func TestMain(m *testing.M) {
	holderMain() // a holder process of the counter chaos (chaos_test.go), when run as one
	goleak.VerifyTestMain(etcdtest.Main(m))
}
