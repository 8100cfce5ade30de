module jobset-inplace.dev/testbed/deviceplugin

go 1.26.0

require (
	google.golang.org/grpc v1.82.1
	k8s.io/kubelet v0.37.2
)

require (
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
