package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/etcdlock/etcdlock"
)

// Header is the HTTP header that carries a fence, in its text form
// (etcdlock.Fence.String).
const Header = "Etcdlock-Fence"

// fenceKey is the context key of NewContext's fence.
type fenceKey struct{}

// NewContext returns a copy of ctx that carries f, for Transport, and for
// a handler behind Handler, which gets the fence it admitted.
func NewContext(ctx context.Context, f etcdlock.Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FromContext returns the fence ctx carries: NewContext's, or else that of
// the hold of the Do or Lead scope of ctx (etcdlock.HoldFrom); false if none.
func FromContext(ctx context.Context) (etcdlock.Fence, bool) {
	if f, ok := ctx.Value(fenceKey{}).(etcdlock.Fence); ok {
		return f, true
	}
	if h, ok := etcdlock.HoldFrom(ctx); ok {
		return h.Fence(), true
	}
	return etcdlock.Fence{}, false
}

// Transport is an http.RoundTripper that adds the fence of each request's
// context (FromContext) to the request, in Header, and sends it with Base. A
// request whose context carries no fence goes as it is; one that carries a
// Header of its own keeps it; one whose fence names no hold (MarshalText
// fails) is not sent, and RoundTrip returns that error.
type Transport struct {
	Base http.RoundTripper // http.DefaultTransport if nil
}

// RoundTrip sends req, with its fence, as Transport describes. It does not
// change req: a request with a fence to add is cloned.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if f, ok := FromContext(req.Context()); ok && req.Header.Get(Header) == "" && f != (etcdlock.Fence{}) {
		text, err := f.MarshalText()
		if err != nil {
			if req.Body != nil {
				_ = req.Body.Close() // a RoundTripper closes the body, even on error
			}
			return nil, fmt.Errorf("fence: request to %s: %w", req.URL.Redacted(), err)
		}
		req = req.Clone(req.Context())
		req.Header.Set(Header, string(text))
	}
	return base.RoundTrip(req)
}

// Handler is an http.Handler that runs Next only for a request whose fence
// (in Header) is of Lock and not stale, within Store.Do: no two requests of
// one lock's fences run Next at once, and none runs after a higher token's
// was admitted. Next gets the fence from FromContext, and, with an
// SQLStore, the transaction to write in from TxFrom. A request is refused
// with a plain-text reason and:
//
//   - 428 Precondition Required: no fence;
//   - 400 Bad Request: a fence that does not parse (etcdlock.ParseFence), or
//     that the Store cannot take (a lock name too long for its table);
//   - 403 Forbidden: a fence of another lock than Lock;
//   - 409 Conflict: a stale fence (ErrStale): its holder has lost the lock;
//   - 503 Service Unavailable: the Store failed (a database down, a commit
//     refused), or the request's context ended while it waited.
//
// Next's response is held until the Store has committed, then sent, so
// that a client never sees a success whose write did not commit; a
// streaming response arrives whole at the end. A response of Next with a
// status of 400 or more is sent without committing (an SQLStore rolls back
// Next's writes and the admission of its token; a Memory keeps the token,
// as the resource it guards may keep part of the writes). Guard with
// Handler the
// routes that write and the reads that a write depends on: a holder's late
// write can land between the next holder's unfenced read and its write,
// and undo it (docs/reliability.md, "Fencing at the resource").
type Handler struct {
	Store Store        // the highest tokens: a *Memory for one process, an SQLStore for several
	Lock  string       // the lock whose fences are accepted; "" accepts any lock's, each against its own highest token
	Next  http.Handler // what the fence guards
}

// ServeHTTP checks the request's fence and runs Next, as Handler describes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.Store == nil || h.Next == nil {
		http.Error(w, "fence: a Handler needs a Store and a Next", http.StatusInternalServerError)
		return
	}
	text := r.Header.Get(Header)
	if text == "" {
		http.Error(w, "fence: no "+Header+" header: a write here needs the fence of a hold of the lock", http.StatusPreconditionRequired)
		return
	}
	f, err := etcdlock.ParseFence(text)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if h.Lock != "" && f.Name != h.Lock {
		http.Error(w, fmt.Sprintf("fence: a fence of lock %q, this resource takes lock %q's", f.Name, h.Lock), http.StatusForbidden)
		return
	}
	resp := bufferedResponse{header: http.Header{}}
	err = h.Store.Do(r.Context(), f, func(ctx context.Context) error {
		h.Next.ServeHTTP(&resp, r.WithContext(NewContext(ctx, f)))
		if resp.status >= http.StatusBadRequest {
			return errRefusedByNext
		}
		return nil
	})
	switch {
	case errors.Is(err, errRefusedByNext):
		resp.send(w)
	case errors.Is(err, ErrStale):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, etcdlock.ErrInvalidArgument), errors.Is(err, etcdlock.ErrInvalidFence):
		// The Store cannot take this fence (a lock name too long for the
		// table, say): no retry will do.
		http.Error(w, err.Error(), http.StatusBadRequest)
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		resp.send(w)
	}
}

// errRefusedByNext rolls back a Store's work whose handler answered with an
// error status; its response is sent as it is.
var errRefusedByNext = errors.New("fence: the handler answered with an error status")

// bufferedResponse holds a handler's response until it may be sent.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

// send writes the held response to w.
func (b *bufferedResponse) send(w http.ResponseWriter) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}
