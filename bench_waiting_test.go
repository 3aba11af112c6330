package etcdlock_test

import (
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// benchWaiting are the numbers of sessions of BenchmarkWaiting.
var benchWaiting = []int{2, 32, 256, 1024}

// benchSessionsPerClient is how many sessions of BenchmarkWaiting share a
// client (and so its connection, keep-alive stream and watch stream).
const benchSessionsPerClient = 32

// BenchmarkWaiting: one lock and n sessions, each with a lease of its own
// and a goroutine that locks and unlocks in a loop; the sessions share a
// client per benchSessionsPerClient. All n wait in the lock's queue before
// the clock starts, and the run ends by cancelling the waits, so every
// acquisition is made with n-1 sessions waiting (benchQueued). One op is one
// acquisition. Besides the metrics of benchContend: cpu-us/op is the CPU
// time of the whole process per acquisition, etcd's server and every client
// together, since etcd runs in the benchmark's process.
//
// The sessions are made once for the runs of a sub-benchmark (go test calls
// it again for each b.N it tries) and closed after it, before the other
// library's half starts.
func BenchmarkWaiting(b *testing.B) {
	for _, n := range benchWaiting {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			e := startBench(b)
			for _, impl := range benchImpls {
				scope := &benchScope{TB: b}
				name := benchName(b) + "_" + impl.name
				lockers := make([]benchLocker, n)
				var c *clientv3.Client
				for i := range lockers {
					if i%benchSessionsPerClient == 0 {
						c = e.client(scope)
					}
					lockers[i] = impl.newSession(scope, c)(name)
				}
				b.Run(impl.name, func(b *testing.B) { benchContend(b, e, name, lockers, benchQueued) })
				scope.close()
			}
		})
	}
}
