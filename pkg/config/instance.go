package config

import (
	"os"
	"strconv"
)

// InstanceID is the default name of this process among the replicas of a
// service ("<hostname>-<pid>"), used in leases and worker registrations
// when GRASP_*_ID is not set: the host name tells operators which pod or
// machine holds a lease, the pid keeps two processes on one host apart.
func InstanceID() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid())
}
