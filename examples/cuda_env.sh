# Sourced by the launch scripts with the trainer's arguments: `source examples/cuda_env.sh "$@"`.
# megatron-core's tensor-parallel layers overlap their all-reduce / all-gather with compute only when the
# GPU runs kernels in the order they were queued (tensor_parallel/layers.py): one hardware queue,
# CUDA_DEVICE_MAX_CONNECTIONS=1, whenever --tensor-model-parallel-size is above 1. It must be set before
# the ranks start CUDA. (A size given only in a --config file is not seen here: export it yourself.)
_tp=1
_previous=
for _arg in "$@"; do
    _flag=${_arg//_/-}  # the trainer also reads --tensor_model_parallel_size
    case "$_flag" in
        --tensor-model-parallel-size=*) _tp=${_arg#*=} ;;
    esac
    if [ "$_previous" = --tensor-model-parallel-size ]; then _tp=$_arg; fi
    _previous=$_flag
done
if [[ "$_tp" =~ ^[0-9]+$ ]] && (( _tp > 1 )); then
    export CUDA_DEVICE_MAX_CONNECTIONS=1
fi
unset _tp _previous _arg _flag
