//! Driver entry points NVIDIA's runtime resolves (`cuGetProcAddress`) for features the
//! simulated node does not simulate. Each answers `CUDA_ERROR_NOT_SUPPORTED`, as a real driver
//! does for a feature its GPU or platform lacks: the runtime resolves them all at start-up and
//! only fails a program that calls one (a framework's allocation paths call none of them). The
//! list is what CUDA 13.2's runtime asks for (`GPUFENCE_MOCK_CUDA_TRACE=1` shows it) less what
//! the other files implement. A stub takes no arguments: under the C calling convention a callee
//! that ignores its arguments may be called with any.

use std::ffi::c_void;

use crate::driver::{CUDA_ERROR_NOT_SUPPORTED, CUresult};

macro_rules! unsupported {
    ($($(#[$doc:meta])* [$($f:ident),* $(,)?])*) => {
        $($(
            #[unsafe(no_mangle)]
            pub extern "C" fn $f() -> CUresult {
                crate::trace::unsupported(stringify!($f));
                CUDA_ERROR_NOT_SUPPORTED
            }
        )*)*
        pub(crate) fn exports() -> Vec<(&'static str, usize)> {
            vec![$($((stringify!($f), $f as *const c_void as usize)),*),*]
        }
    };
}

unsupported! {
    /// 3D and batched copies
    [
        cuMemcpy3D,
        cuMemcpy3DAsync,
        cuMemcpy3DBatchAsync,
        cuMemcpy3DPeer,
        cuMemcpy3DPeerAsync,
        cuMemcpyBatchAsync,
    ]
    /// CUDA arrays beyond allocation
    [
        cuArray3DGetDescriptor,
        cuArrayGetDescriptor,
        cuArrayGetMemoryRequirements,
        cuArrayGetPlane,
        cuArrayGetSparseProperties,
        cuMipmappedArrayGetLevel,
        cuMipmappedArrayGetMemoryRequirements,
        cuMipmappedArrayGetSparseProperties,
    ]
    /// EGL interop
    [
        cuEGLStreamConsumerAcquireFrame,
        cuEGLStreamConsumerConnect,
        cuEGLStreamConsumerConnectWithFlags,
        cuEGLStreamConsumerDisconnect,
        cuEGLStreamConsumerReleaseFrame,
        cuEGLStreamProducerConnect,
        cuEGLStreamProducerDisconnect,
        cuEGLStreamProducerPresentFrame,
        cuEGLStreamProducerReturnFrame,
        cuGraphicsEGLRegisterImage,
    ]
    /// JIT linking (the `_v2` forms are what a library that binds the driver by `dlsym`, as
    /// cuBLASLt does, asks for; it refuses to start when one is missing)
    [
        cuLinkAddData,
        cuLinkAddData_v2,
        cuLinkAddFile,
        cuLinkAddFile_v2,
        cuLinkComplete,
        cuLinkCreate,
        cuLinkCreate_v2,
        cuLinkDestroy,
    ]
    /// OpenGL interop
    [
        cuGLCtxCreate,
        cuGLGetDevices,
        cuGLInit,
        cuGLMapBufferObject,
        cuGLMapBufferObjectAsync,
        cuGLRegisterBufferObject,
        cuGLSetBufferObjectMapFlags,
        cuGLUnmapBufferObject,
        cuGLUnmapBufferObjectAsync,
        cuGLUnregisterBufferObject,
        cuGraphicsGLRegisterBuffer,
        cuGraphicsGLRegisterImage,
    ]
    /// VDPAU interop
    [
        cuGraphicsVDPAURegisterOutputSurface,
        cuGraphicsVDPAURegisterVideoSurface,
        cuVDPAUCtxCreate,
        cuVDPAUGetDevice,
    ]
    /// batched prefetch and discard
    [
        cuMemDiscardAndPrefetchBatchAsync,
        cuMemDiscardBatchAsync,
        cuMemPrefetchBatchAsync,
    ]
    /// driver logs
    [
        cuLogsCurrent,
        cuLogsDumpToFile,
        cuLogsDumpToMemory,
        cuLogsRegisterCallback,
        cuLogsUnregisterCallback,
    ]
    /// explicit graph construction
    [
        cuGraphAddDependencies,
        cuGraphAddEmptyNode,
        cuGraphAddEventRecordNode,
        cuGraphAddEventWaitNode,
        cuGraphAddExternalSemaphoresSignalNode,
        cuGraphAddExternalSemaphoresWaitNode,
        cuGraphAddHostNode,
        cuGraphAddKernelNode,
        cuGraphAddMemcpyNode,
        cuGraphAddMemsetNode,
        cuGraphChildGraphNodeGetGraph,
        cuGraphConditionalHandleCreate,
        cuGraphDebugDotPrint,
        cuGraphDestroyNode,
        cuGraphEventRecordNodeGetEvent,
        cuGraphEventRecordNodeSetEvent,
        cuGraphEventWaitNodeGetEvent,
        cuGraphEventWaitNodeSetEvent,
        cuGraphExecChildGraphNodeSetParams,
        cuGraphExecEventRecordNodeSetEvent,
        cuGraphExecEventWaitNodeSetEvent,
        cuGraphExecExternalSemaphoresSignalNodeSetParams,
        cuGraphExecExternalSemaphoresWaitNodeSetParams,
        cuGraphExecGetFlags,
        cuGraphExecHostNodeSetParams,
        cuGraphExecKernelNodeSetParams,
        cuGraphExecMemcpyNodeSetParams,
        cuGraphExecMemsetNodeSetParams,
        cuGraphExecNodeSetParams,
        cuGraphExternalSemaphoresSignalNodeGetParams,
        cuGraphExternalSemaphoresSignalNodeSetParams,
        cuGraphExternalSemaphoresWaitNodeGetParams,
        cuGraphExternalSemaphoresWaitNodeSetParams,
        cuGraphGetEdges,
        cuGraphGetRootNodes,
        cuGraphHostNodeGetParams,
        cuGraphHostNodeSetParams,
        cuGraphInstantiate,
        cuGraphKernelNodeCopyAttributes,
        cuGraphKernelNodeGetAttribute,
        cuGraphKernelNodeGetParams,
        cuGraphKernelNodeSetAttribute,
        cuGraphKernelNodeSetParams,
        cuGraphMemAllocNodeGetParams,
        cuGraphMemFreeNodeGetParams,
        cuGraphMemcpyNodeGetParams,
        cuGraphMemcpyNodeSetParams,
        cuGraphMemsetNodeGetParams,
        cuGraphMemsetNodeSetParams,
        cuGraphNodeFindInClone,
        cuGraphNodeGetDependencies,
        cuGraphNodeGetDependentNodes,
        cuGraphNodeGetEnabled,
        cuGraphNodeGetType,
        cuGraphNodeSetEnabled,
        cuGraphNodeSetParams,
        cuGraphReleaseUserObject,
        cuGraphRemoveDependencies,
        cuGraphRetainUserObject,
        cuStreamBeginCaptureToGraph,
        cuStreamUpdateCaptureDependencies,
        cuUserObjectCreate,
        cuUserObjectRelease,
        cuUserObjectRetain,
    ]
    /// external memory and semaphores
    [
        cuDestroyExternalMemory,
        cuDestroyExternalSemaphore,
        cuDeviceGetNvSciSyncAttributes,
        cuExternalMemoryGetMappedBuffer,
        cuExternalMemoryGetMappedMipmappedArray,
        cuImportExternalMemory,
        cuImportExternalSemaphore,
        cuSignalExternalSemaphoresAsync,
        cuWaitExternalSemaphoresAsync,
    ]
    /// graphics interop
    [
        cuGraphicsMapResources,
        cuGraphicsResourceGetMappedEglFrame,
        cuGraphicsResourceGetMappedMipmappedArray,
        cuGraphicsResourceGetMappedPointer,
        cuGraphicsResourceSetMapFlags,
        cuGraphicsSubResourceGetMappedArray,
        cuGraphicsUnmapResources,
        cuGraphicsUnregisterResource,
    ]
    /// green contexts
    [
        cuCtxFromGreenCtx,
        cuCtxGetDevResource,
        cuDevResourceGenerateDesc,
        cuDevSmResourceSplitByCount,
        cuDeviceGetDevResource,
        cuGreenCtxCreate,
        cuGreenCtxDestroy,
        cuGreenCtxGetDevResource,
        cuGreenCtxGetId,
        cuGreenCtxRecordEvent,
        cuGreenCtxStreamCreate,
        cuGreenCtxWaitEvent,
    ]
    /// managed range attributes
    [
        cuMemRangeGetAttribute,
        cuMemRangeGetAttributes,
    ]
    /// other
    [
        cuCtxDetach,
        cuCtxRecordEvent,
        cuCtxWaitEvent,
        cuDeviceGetHostAtomicCapabilities,
        cuDeviceGetP2PAtomicCapabilities,
        cuDeviceRegisterAsyncNotification,
        cuDeviceUnregisterAsyncNotification,
        cuFuncGetParamInfo,
        cuIpcGetEventHandle,
        cuIpcOpenEventHandle,
        cuKernelGetParamInfo,
        cuStreamAttachMemAsync,
    ]
    /// multicast objects (NVLink SHARP)
    [
        cuMulticastCreate,
        cuMulticastAddDevice,
        cuMulticastBindMem,
        cuMulticastBindAddr,
        cuMulticastUnbind,
        cuMulticastGetGranularity,
    ]
    /// tensor maps (TMA descriptors) beyond the tiled one (`functions.rs`)
    [
        cuTensorMapEncodeIm2col,
        cuTensorMapReplaceAddress,
    ]
    /// pool export and import (IPC of pools)
    [
        cuMemPoolExportPointer,
        cuMemPoolExportToShareableHandle,
        cuMemPoolImportFromShareableHandle,
        cuMemPoolImportPointer,
    ]
    /// profiler control
    [
        cuProfilerInitialize,
        cuProfilerStart,
        cuProfilerStop,
    ]
    /// stream memory operations
    [
        cuStreamBatchMemOp,
        cuStreamWaitValue32,
        cuStreamWaitValue64,
        cuStreamWriteValue32,
        cuStreamWriteValue64,
    ]
    /// textures and surfaces
    [
        cuModuleGetSurfRef,
        cuModuleGetTexRef,
        cuSurfObjectCreate,
        cuSurfObjectDestroy,
        cuSurfObjectGetResourceDesc,
        cuTexObjectCreate,
        cuTexObjectDestroy,
        cuTexObjectGetResourceDesc,
        cuTexObjectGetResourceViewDesc,
        cuTexObjectGetTextureDesc,
    ]
}
