package etcdlock

import (
	"context"
	"slices"
)

// A scope is the hold of one Do while its f runs: any goroutine whose
// context carries the scope holds the lock with the goroutine that called
// Do. It ends when f returns, and with it the holds taken through it; a
// context kept after that grants nothing.
type scope struct {
	holds int // holds taken through the scope by other goroutines; guarded by the record's mu
}

// scopeKey is the context key of a lock's scope: the lock's record, which
// cannot be retired while a scope is open (its lock is held). One pointer:
// looking it up allocates nothing.
type scopeKey struct{ st *lockState }

// scopeOf returns the open scope ctx carries for the lock, nil if none. st.mu
// must be held.
func (st *lockState) scopeOf(ctx context.Context) *scope {
	if len(st.scopes) == 0 {
		return nil
	}
	sc, _ := ctx.Value(scopeKey{st}).(*scope)
	if sc == nil || !slices.Contains(st.scopes, sc) {
		return nil
	}
	return sc
}

// ownHolds returns the holds of the owner goroutine itself. st.mu must be
// held.
func (st *lockState) ownHolds() int {
	n := st.holds
	for _, sc := range st.scopes {
		n -= sc.holds
	}
	return n
}

// openScope opens a scope for the calling goroutine's hold and returns a
// context, derived from ctx, that carries it.
func (st *lockState) openScope(ctx context.Context) (context.Context, *scope) {
	sc := &scope{}
	st.mu.Lock()
	st.scopes = append(st.scopes, sc)
	st.mu.Unlock()
	return context.WithValue(ctx, scopeKey{st}, sc), sc
}

// closeScope ends sc, and the holds its goroutines still have.
func (st *lockState) closeScope(sc *scope) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.scopes = slices.DeleteFunc(st.scopes, func(o *scope) bool { return o == sc })
	st.holds -= sc.holds
	sc.holds = 0
}
