// Package storetest is the conformance suite of the [store.Store] contract.
//
// Every store implementation runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return memstore.New() })
//	}
//
// The suite runs against real time with short windows. It asserts safety
// (never more grants than a limit allows) strictly and timing only from
// below (a request waited at least until a reset), with generous upper
// bounds, so that it stays reliable on a loaded machine and under the race
// detector.
package storetest
