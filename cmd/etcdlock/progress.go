package main

import (
	"fmt"
	"os"
	"time"
)

// run's --watchdog: COMMAND reports progress by touching a file, as a
// leader's duty calls etcdlock.Progress; one that stops gives up the lock.

// A progressWatch watches the file whose path COMMAND gets as
// $ETCDLOCK_PROGRESS: stalled closes once its modification time has not
// moved for the period (counted from the start, before the first touch).
type progressWatch struct {
	path    string
	stalled chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// watchProgress creates the progress file and starts watching it.
func watchProgress(period time.Duration) (*progressWatch, error) {
	f, err := os.CreateTemp("", "etcdlock-progress-*")
	if err != nil {
		return nil, fmt.Errorf("--watchdog: create the progress file: %w", err)
	}
	f.Close()
	w := &progressWatch{path: f.Name(), stalled: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go w.watch(period)
	return w, nil
}

// watch looks at the file's modification time a few times a period (a
// file of this machine, not etcd) until it is stale or close is called.
func (w *progressWatch) watch(period time.Duration) {
	defer close(w.done)
	// A touch is a change of the file's modification time, timed by this
	// clock when it is seen: the file system's clock may differ.
	last := time.Now()
	var seen time.Time
	if fi, err := os.Stat(w.path); err == nil {
		seen = fi.ModTime()
	}
	tick := time.NewTicker(max(min(period/4, time.Second), time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		if fi, err := os.Stat(w.path); err == nil && !fi.ModTime().Equal(seen) {
			seen, last = fi.ModTime(), time.Now()
		}
		if time.Since(last) >= period {
			close(w.stalled)
			return
		}
	}
}

// close stops the watch and removes the file.
func (w *progressWatch) close() {
	close(w.stop)
	<-w.done
	os.Remove(w.path)
}
