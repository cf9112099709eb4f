module github.com/grasp-sync/grasp-sync/services/relay

go 1.26.0

require (
	github.com/grasp-sync/grasp-sync/pkg v0.0.0
	github.com/grasp-sync/grasp-sync/proto v0.0.0
)

replace (
	github.com/grasp-sync/grasp-sync/pkg => ../../pkg
	github.com/grasp-sync/grasp-sync/proto => ../../proto
)
