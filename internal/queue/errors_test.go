package queue

import (
	"context"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefused: only etcd's own refusals say that a request was not applied;
// a lost reply, a deadline, a timeout inside etcd, or a gRPC error of the
// client's own (a reply too large to receive, after the apply) may hide an
// applied request.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrPermissionDenied, true},
		{fmt.Errorf("wrapped: %w", rpctypes.ErrPermissionDenied), true},
		{rpctypes.ErrLeaseNotFound, true},
		{rpctypes.ErrNoSpace, true},
		{rpctypes.ErrTooManyRequests, true},
		{rpctypes.ErrInvalidAuthToken, true},
		{rpctypes.ErrTimeout, false},
		{rpctypes.ErrLeaderChanged, false},
		{rpctypes.ErrNoLeader, false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max"), false},
		{status.Error(codes.PermissionDenied, "not etcd's"), false},
		{nil, false},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("refused(%v): got %v, want %v", tc.err, got, tc.want)
		}
	}
}
