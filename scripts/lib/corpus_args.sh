# Sourced by the pair scripts: reads run.sh's corpus options from CORPUS_ARGS (or the default given as $1) and sets
# corpus_args (the array), size, limit, train, seed, conf, room_epochs and C, the corpus folder run.sh names for
# them (exp/corpus_<size>[_<limit>][_train<N>]_seed<S>; run.sh has no option that prints it, so a change there must
# be made here too: a missing folder stops the callers with an error that names it).
read -r -a corpus_args <<< "${CORPUS_ARGS:-$1}"
size=small; limit=""; train=""; seed=0; conf=$ROOT/recipes/bfa/conf/cpu-small.yaml; room_epochs=28
for ((i = 0; i + 1 < ${#corpus_args[@]}; i++)); do
  case "${corpus_args[i]}" in
    --size) size=${corpus_args[i + 1]} ;; --limit) limit=${corpus_args[i + 1]} ;;
    --train) train=${corpus_args[i + 1]} ;; --seed) seed=${corpus_args[i + 1]} ;;
    --conf) conf=${corpus_args[i + 1]} ;; --room-epochs) room_epochs=${corpus_args[i + 1]} ;;
  esac
done
C=$ROOT/exp/corpus_${size}${limit:+_$limit}${train:+_train$train}_seed$seed
