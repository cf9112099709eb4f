module github.com/grasp-sync/grasp-sync/services/graspctl

go 1.26.0

replace (
	github.com/grasp-sync/grasp-sync/pkg => ../../pkg
	github.com/grasp-sync/grasp-sync/proto => ../../proto
)
