package etcdlock

// Queued returns how many goroutines of this process wait for their turn on
// the lock name of s.
func Queued(s *Session, name string) int {
	s.mu.Lock()
	st := s.locks[name]
	s.mu.Unlock()
	if st == nil {
		return 0
	}
	return st.waiting()
}
